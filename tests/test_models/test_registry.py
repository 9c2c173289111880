import pytest
import torch
from mmengine.config import Config

import polaformer_mm  # noqa: F401


def _registries():
    from mmdet.registry import MODELS as DET
    from mmpretrain.registry import MODELS as PRETRAIN
    from mmseg.registry import MODELS as SEG
    return {'mmdet': DET, 'mmseg': SEG, 'mmpretrain': PRETRAIN}


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
@pytest.mark.parametrize('type_name', ['PolaPVT', 'PolaSwin'])
def test_backbones_build_from_each_registry(scope, type_name):
    registry = _registries()[scope]
    model = registry.build(dict(type=type_name, arch='tiny', out_indices=(3, )))
    assert type(model).__name__ == type_name
    assert model(torch.randn(1, 3, 64, 64))[0].shape[-2:] == (2, 2)


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_attention_builds_from_each_registry(scope):
    attn = _registries()[scope].build(
        dict(type='PolaLinearAttention', embed_dims=32, num_heads=2, pos_grid=(4, 4)))
    out = attn(torch.randn(2, 6 * 5, 32), (6, 5))
    assert out.shape == (2, 30, 32)


def test_config_with_custom_imports(tmp_path):
    cfg_file = tmp_path / 'cfg.py'
    cfg_file.write_text(
        "custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)\n"
        "model = dict(type='RetinaNet', data_preprocessor=dict(type='DetDataPreprocessor'),\n"
        "    backbone=dict(type='PolaPVT', arch='tiny'),\n"
        "    neck=dict(type='FPN', in_channels=[64, 128, 320, 512], out_channels=32,\n"
        "              start_level=1, add_extra_convs='on_input', num_outs=5),\n"
        "    bbox_head=dict(type='RetinaHead', num_classes=3, in_channels=32,\n"
        "        feat_channels=32, stacked_convs=1,\n"
        "        anchor_generator=dict(type='AnchorGenerator', octave_base_scale=4,\n"
        "            scales_per_octave=3, ratios=[0.5, 1.0, 2.0],\n"
        "            strides=[8, 16, 32, 64, 128]),\n"
        "        bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[.0] * 4,\n"
        "            target_stds=[1.0] * 4),\n"
        "        loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2.0,\n"
        "            alpha=0.25, loss_weight=1.0),\n"
        "        loss_bbox=dict(type='L1Loss', loss_weight=1.0)),\n"
        "    test_cfg=dict(nms_pre=100, min_bbox_size=0, score_thr=0.05,\n"
        "        nms=dict(type='nms', iou_threshold=0.5), max_per_img=10))\n")
    cfg = Config.fromfile(str(cfg_file))
    import mmdet.models  # noqa: F401  (registers RetinaNet & co.)
    from mmdet.registry import MODELS
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmdet'):  # as the Runner does
        detector = MODELS.build(cfg.model)
    feats = detector.extract_feat(torch.randn(1, 3, 96, 128))
    assert [f.shape[-2:] for f in feats] == [(12, 16), (6, 8), (3, 4), (2, 2), (1, 1)]
