"""Every dense config: one training iteration and one validation pass on synthetic data.

The config's own model, transforms, optimizer, schedulers and metric run through
PolaRunner (mmengine's Runner); only data paths, image sizes, batch size and schedule
length are reduced (tests/_smoke.py).
"""
import glob
import math
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook

from polaformer_mm.engine import entry
from tests import REPO
from .._smoke import configs_to_train, smoke_config

DENSE = sorted(
    p for p in glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True)
    if '_base_' not in p and '/imagenet/' not in p)
# COCO panoptic configs read panoptic PNG annotations, which the synthetic data does not
# have: they are built (tests/test_configs) but not trained here.
NOT_ON_SYNTHETIC = ('_coco-panoptic.py', )
TRAINED = configs_to_train([p for p in DENSE if not p.endswith(NOT_ON_SYNTHETIC)]) + [
    pytest.param(p, marks=pytest.mark.skip(reason='no panoptic annotations in the synthetic data'))
    for p in DENSE if p.endswith(NOT_ON_SYNTHETIC)
]


def test_dense_configs_found():
    assert len(DENSE) >= 30, DENSE


def test_one_per_size_family_keeps_the_smallest_of_each_group(monkeypatch):
    monkeypatch.setenv('POLA_TEST_TRAINS', 'one-per-size-family')
    kept = configs_to_train(DENSE)
    names = [osp.basename(p) for p in kept]
    assert 'mask-rcnn_pola-pvt-t_fpn_1x_coco.py' in names
    assert 'mask-rcnn_pola-pvt-s_fpn_1x_coco.py' not in names
    assert 'upernet_pola-deit-s16_8xb2-80k_ade20k-512x512.py' in names
    assert not any('deit-b16' in n or 'pvtv2-b1' in n for n in names)
    assert len(kept) < len(DENSE)
    monkeypatch.setenv('POLA_TEST_TRAINS', 'some')
    with pytest.raises(ValueError, match='POLA_TEST_TRAINS'):
        configs_to_train(DENSE)


def _pair(path):
    """(detector or segmentor, backbone family) of a config name: ('mask-rcnn', 'pola-pvt')."""
    kind, backbone = osp.basename(path).split('_')[:2]
    parts = backbone.split('-')
    return kind, '-'.join(parts[:2] if parts[0] == 'pola' else parts[:1])


def test_one_per_pair_trains_every_detector_and_segmentor_with_every_family(monkeypatch):
    monkeypatch.setenv('POLA_TEST_TRAINS', 'one-per-pair')
    kept = configs_to_train(DENSE)
    assert {_pair(p) for p in kept} == {_pair(p) for p in DENSE}
    names = [osp.basename(p) for p in kept]
    assert 'mask-rcnn_pola-pvt-t_fpn_1x_coco.py' in names
    assert 'mask-rcnn_pvt-t_fpn_1x_coco.py' in names
    # one Semantic FPN with Pola-PVT (ADE20K or Cityscapes); mmdet's Mask2Former (COCO) and
    # mmseg's are two models
    assert sum('/pola_pvt/fpn_pola-pvt-' in p for p in kept) == 1
    assert sum(n.startswith('mask2former_pola-swin-') for n in names) == 2
    assert len(kept) < len(DENSE) // 3


@pytest.mark.slow
@pytest.mark.parametrize('path', TRAINED, ids=lambda p: osp.relpath(p, REPO))
def test_one_iteration_and_validation(path, synthetic_data_root, tmp_path):
    cfg = entry.load_config(path)
    smoke_config(cfg, synthetic_data_root, tmp_path)
    runner = entry.build_runner(cfg)
    seen = MetricsCatcher()
    runner.register_hook(seen)
    before = {k: v.detach().clone() for k, v in runner.model.named_parameters() if v.requires_grad}
    runner.train()
    assert runner.iter == 1
    changed = [
        k for k, v in runner.model.named_parameters()
        if v.requires_grad and not torch.equal(v, before[k])
    ]
    assert any(k.startswith('backbone.') for k in changed), 'backbone did not learn'
    scalars = runner.message_hub.log_scalars
    loss = scalars['train/loss'].current()
    assert math.isfinite(loss)
    assert seen.metrics is not None, 'no validation pass'
    if cfg.default_scope == 'mmdet':
        # CocoMetric returns {} when an untrained detector scores nothing above its
        # threshold (RetinaNet's prior); otherwise both metrics must be there
        if seen.metrics:
            assert 'coco/bbox_mAP' in seen.metrics, seen.metrics
            if 'mask' in osp.basename(path):
                assert 'coco/segm_mAP' in seen.metrics, seen.metrics
    else:
        assert 'mIoU' in seen.metrics, seen.metrics


class MetricsCatcher(Hook):
    priority = 'LOWEST'

    def __init__(self):
        self.metrics = None

    def after_val_epoch(self, runner, metrics=None):
        self.metrics = dict(metrics or {})


@pytest.mark.slow
def test_cityscapes_whole_image_inference(tmp_path):
    """A Pola segmentor of the Cityscapes configs segments a full 1024x2048 image in one
    forward (``test_cfg.mode='whole'``) through the config's own test pipeline."""
    import cv2
    import numpy as np
    from mmengine.dataset import Compose, pseudo_collate
    from mmengine.registry import DefaultScope
    from mmseg.registry import MODELS

    cfg = entry.load_config(
        osp.join(REPO, 'configs/pola_pvt/fpn_pola-pvt-t_4xb2-80k_cityscapes-512x1024.py'))
    assert cfg.model.test_cfg.mode == 'whole'
    cfg.model.backbone.init_cfg = None
    img = tmp_path / 'x_leftImg8bit.png'
    seg = tmp_path / 'x_gtFine_labelTrainIds.png'
    cv2.imwrite(str(img), np.random.default_rng(0).integers(0, 256, (1024, 2048, 3), np.uint8))
    cv2.imwrite(str(seg), np.zeros((1024, 2048), np.uint8))
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.model).eval()
        data = Compose(cfg.test_dataloader.dataset.pipeline)(
            dict(img_path=str(img), seg_map_path=str(seg), reduce_zero_label=False, seg_fields=[]))
        assert tuple(data['inputs'].shape) == (3, 1024, 2048)  # whole image, not resized
        with torch.no_grad():
            (out, ) = model.test_step(pseudo_collate([data]))
    pred = out.pred_sem_seg.data
    assert tuple(pred.shape) == (1, 1024, 2048)
    assert int(pred.min()) >= 0 and int(pred.max()) < 19
