"""The dense recipes against their sources, read from the configs after inheritance.

Every dense config group whose detector / segmentor and backbone family the dense code of
PolaFormer's lineage has (LeapLabTHU/Agent-Attention ``downstream/{detection,segmentation}/
configs/agent_{pvt,swin}/``) takes that code's settings for its size, in the Pola config and
its softmax baseline alike: optimizer, lr, weight decay and its exemptions, warm-up,
schedule, images per GPU x GPUs, drop path, train / test pipelines, float32 or AMP. The
tables below are those configs' values (docs/user_guides/protocol.md gives the file of
each). Every dense config sets seed 0. The Pola-Swin dense configs compute their 'L'
stages over the whole stage map, as the lineage's downstream Swin does: checked on the
backbone each config builds, by what a first-stage token attends to.
"""
import glob
import json
import os.path as osp
from functools import lru_cache

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from polaformer_mm.workflows.reproduce import protocol_gpus
from tests import REPO
from tests._configs import load_config as _load  # one parse per config and session

SWIN_NO_DECAY = {
    'absolute_pos_embed', 'relative_position_bias_table', 'norm', 'positional_encoding', 'pos_embed'
}
COCO_SINGLE_SCALE = ('single', (1333, 800))
COCO_MS_CROP = ('ms-crop', (480, 800, 1333), (384, 600))
ADE20K = ('ade20k', (2048, 512), (0.5, 2.0), (512, 512))

# group -> (config pattern with {pola} and {s}, sizes, the recipe)
MMDET_1X = dict(warmup=(0.001, 500), epochs=12, milestones=[8, 11])
MMDET_3X = dict(warmup=(0.001, 500), epochs=36, milestones=[27, 33])
SWIN_OPTIM = dict(
    optimizer=('AdamW', 1e-4, 0.05), betas=(0.9, 0.999), no_decay=SWIN_NO_DECAY, amp=False)
GROUPS = {
    # agent_pvt_{t,s,m,l}_mrcnn_1x_12-16-28-28.py
    'pvt-mask-rcnn-1x': ('configs/pola_pvt/mask-rcnn_{pola}pvt-{s}_fpn_1x_coco.py', 'tsml',
                         dict(
                             optimizer=('AdamW', 2e-4, 1e-4),
                             no_decay=set(),
                             amp=False,
                             **MMDET_1X,
                             batch=(8, 2),
                             drop_path=dict(t=0.1, s=0.2, m=0.1, l=0.2),
                             train=COCO_SINGLE_SCALE)),
    # agent_pvt_{t,s,m,l}_rtn_1x_12-16-28-28.py
    'pvt-retinanet-1x': ('configs/pola_pvt/retinanet_{pola}pvt-{s}_fpn_1x_coco.py', 'tsml',
                         dict(
                             optimizer=('AdamW', 1e-4, 1e-4),
                             no_decay=set(),
                             amp=False,
                             **MMDET_1X,
                             batch=(8, 2),
                             drop_path=dict(t=0.1, s=0.1, m=0.2, l=0.3),
                             train=COCO_SINGLE_SCALE)),
    # fpn_agent_pvt_{t,s,m,l}_12-16-28-28.py (8 GPUs: whai362/PVT's Semantic FPN)
    'pvt-semantic-fpn': ('configs/pola_pvt/fpn_{pola}pvt-{s}_8xb2-40k_ade20k-512x512.py', 'tsml',
                         dict(
                             optimizer=('AdamW', 2e-4, 1e-4),
                             no_decay=set(),
                             amp=False,
                             warmup=None,
                             iters=40000,
                             poly=(0.9, 0.0),
                             interval=4000,
                             batch=(8, 2),
                             drop_path=dict(t=0.1, s=0.1, m=0.2, l=0.1),
                             train=ADE20K)),
    # agent_swin_{t,s}_mrcnn_1x_9-12-14-7.py
    'swin-mask-rcnn-1x':
    ('configs/pola_swin/mask-rcnn_{pola}swin-{s}-p4-w7_fpn_ms-crop-1x_coco.py', 'ts',
     dict(**SWIN_OPTIM, **MMDET_1X, batch=(8, 2), drop_path=dict(t=0.1, s=0.1),
          train=COCO_MS_CROP)),
    # agent_swin_{t,s}_mrcnn_3x_9-12-14-7.py
    'swin-mask-rcnn-3x':
    ('configs/pola_swin/mask-rcnn_{pola}swin-{s}-p4-w7_fpn_ms-crop-3x_coco.py', 'ts',
     dict(**SWIN_OPTIM, **MMDET_3X, batch=(8, 2), drop_path=dict(t=0.1, s=0.1),
          train=COCO_MS_CROP)),
    # agent_swin_{t,s}_crcnn_3x_9-12-14-7.py
    'swin-cascade-3x':
    ('configs/pola_swin/cascade-mask-rcnn_{pola}swin-{s}-p4-w7_fpn_4conv1fc-giou_'
     'ms-crop-3x_coco.py', 'ts',
     dict(
         **SWIN_OPTIM,
         **MMDET_3X,
         batch=(8, 2),
         drop_path=dict(t=0.1, s=0.1),
         train=COCO_MS_CROP,
         giou_heads=True)),
    # upernet_agent_swin_{t,s,b}_9-12-14-7.py
    'swin-upernet': ('configs/pola_swin/upernet_{pola}swin-{s}_8xb2-160k_ade20k-512x512.py', 'tsb',
                     dict(
                         optimizer=('AdamW', 6e-5, 0.01),
                         betas=(0.9, 0.999),
                         no_decay=SWIN_NO_DECAY,
                         amp=False,
                         warmup=(1e-6, 1500),
                         iters=160000,
                         poly=(1.0, 0.0),
                         interval=16000,
                         batch=(8, 2),
                         drop_path=dict(t=0.3, s=0.3, b=0.5),
                         train=ADE20K)),
}
CASES = [(group, pattern.format(pola=pola, s=s), s)
         for group, (pattern, sizes, _) in GROUPS.items() for s in sizes for pola in ('', 'pola-')]


def _train_pipeline(cfg):
    dataset = cfg.train_dataloader.dataset
    while 'pipeline' not in dataset:  # dataset wrappers
        dataset = dataset.dataset
    return dataset.pipeline


def _train_transforms(cfg):
    """The train pipeline, as the recipe kinds above."""
    steps = {t['type']: t for t in _train_pipeline(cfg)}
    if 'RandomChoice' in steps:
        first, second = steps['RandomChoice']['transforms']
        heights = sorted({h for h, _ in first[0]['scales']})
        assert [t['type']
                for t in second] == ['RandomChoiceResize', 'RandomCrop', 'RandomChoiceResize']
        assert second[0]['scales'] == [(400, 1333), (500, 1333), (600, 1333)]
        assert second[2]['scales'] == first[0]['scales']
        assert second[1]['crop_type'] == 'absolute_range' and second[1]['allow_negative_crop']
        assert heights == list(range(480, 801, 32))
        return ('ms-crop', (heights[0], heights[-1], first[0]['scales'][0][1]),
                tuple(second[1]['crop_size']))
    if 'RandomResize' in steps:
        resize, crop = steps['RandomResize'], steps['RandomCrop']
        assert crop['cat_max_ratio'] == 0.75 and 'PhotoMetricDistortion' in steps
        return ('ade20k', tuple(resize['scale']), tuple(resize['ratio_range']),
                tuple(crop['crop_size']))
    assert steps['Resize']['keep_ratio'] and steps['RandomFlip']['prob'] == 0.5
    return ('single', tuple(steps['Resize']['scale']))


@pytest.mark.parametrize('group,path,size', CASES, ids=[p for _, p, _ in CASES])
def test_recipe_follows_the_lineage(group, path, size):
    recipe = GROUPS[group][2]
    cfg = _load(path)
    wrapper = cfg.optim_wrapper
    opt = wrapper.optimizer
    assert (opt.type, opt.lr, opt.weight_decay) == recipe['optimizer']
    if 'betas' in recipe:
        assert tuple(opt.betas) == recipe['betas']
    keys = wrapper.get('paramwise_cfg', {}).get('custom_keys', {})
    assert {k for k, v in keys.items() if v.get('decay_mult') == 0.} == recipe['no_decay']
    assert (wrapper.get('type', 'OptimWrapper') == 'AmpOptimWrapper') is recipe['amp']
    assert wrapper.get('clip_grad') is None

    schedulers = list(cfg.param_scheduler)
    warmup = [s for s in schedulers if s.type == 'LinearLR']
    if recipe['warmup'] is None:
        assert not warmup
    else:
        (w, ) = warmup
        assert (w.start_factor, w.end, w.by_epoch) == (*recipe['warmup'], False)
    if 'epochs' in recipe:
        (steps, ) = [s for s in schedulers if s.type == 'MultiStepLR']
        assert cfg.train_cfg.max_epochs == steps.end == recipe['epochs']
        assert list(steps.milestones) == recipe['milestones'] and steps.gamma == 0.1
    else:
        (poly, ) = [s for s in schedulers if s.type == 'PolyLR']
        assert (poly.power, poly.eta_min) == recipe['poly']
        assert cfg.train_cfg.max_iters == poly.end == recipe['iters']
        assert cfg.train_cfg.val_interval == recipe['interval']
        assert cfg.default_hooks.checkpoint.interval == recipe['interval']
    assert (protocol_gpus(cfg, path), cfg.train_dataloader.batch_size) == recipe['batch']
    assert cfg.model.backbone.drop_path_rate == recipe['drop_path'][size]
    assert _train_transforms(cfg) == recipe['train']
    if recipe.get('giou_heads'):
        for head in cfg.model.roi_head.bbox_head:
            assert (head.type, head.num_shared_convs, head.num_shared_fcs) == ('ConvFCBBoxHead', 4,
                                                                               1)
            assert head.loss_bbox.type == 'GIoULoss' and head.loss_bbox.loss_weight == 10.0
            assert head.reg_decoded_bbox and not head.reg_class_agnostic


def _dense_configs():
    kinds = ('mask-rcnn', 'retinanet', 'fpn', 'upernet', 'cascade-mask-rcnn', 'mask2former')
    paths = glob.glob(osp.join(REPO, 'configs', 'pola_*', '*.py'))
    return sorted(osp.relpath(p, REPO) for p in paths if osp.basename(p).split('_')[0] in kinds)


DENSE = _dense_configs()


def test_every_group_is_covered():
    assert len(DENSE) >= 100
    covered = {path for _, path, _ in CASES}
    assert covered <= set(DENSE), covered - set(DENSE)


@pytest.mark.parametrize('path', DENSE)
def test_every_dense_config_sets_a_seed(path):
    assert _load(path).randomness == dict(seed=0)


POLA_SWIN_DENSE = [p for p in DENSE if osp.basename(p).split('_')[1].startswith('pola-swin')]


@lru_cache(maxsize=None)
def _backbone(scope, backbone_cfg):
    """The backbone of a config (built once per distinct backbone dict)."""
    from mmengine.registry import MODELS
    with DefaultScope.overwrite_default_scope(scope):
        return MODELS.build(json.loads(backbone_cfg))


def _first_stage_reach(cfg, size):
    """How far the first 'L' block of stage 0 of the config's backbone reaches on a
    ``size`` map: the gradient of its output token (0, 0) with respect to every input
    token, as a (H, W) map of absolute sums."""
    backbone_cfg = cfg.model.backbone.to_dict()
    # random weights and no stochastic depth (eval mode): only the wiring matters here
    backbone_cfg.pop('init_cfg', None)
    backbone_cfg.pop('drop_path_rate', None)
    backbone = _backbone(cfg.default_scope, json.dumps(backbone_cfg, sort_keys=True)).eval()
    block = backbone.stages[0].blocks[0]
    assert block.uses_pola
    C = backbone.arch['embed_dims']
    x = torch.randn(1, size[0] * size[1], C, requires_grad=True)
    out = block(x, size)
    out[0, 0].sum().backward()
    return backbone, x.grad[0].abs().sum(-1).view(*size)


@pytest.mark.parametrize('path', POLA_SWIN_DENSE)
def test_pola_swin_dense_configs_attend_over_the_whole_map(path):
    """Each dense Pola-Swin config builds a backbone whose 'L' blocks take the whole stage
    map (no window, no shift, no padding), and a first-stage token of a 64x80 map (a 256x320
    image: larger than the 56-token official window both ways) depends on every token,
    the farthest corner included."""
    cfg = _load(path)
    assert cfg.model.backbone.type == 'PolaSwin'
    assert cfg.model.backbone.linear_window_size is None
    torch.manual_seed(0)
    backbone, reach = _first_stage_reach(cfg, (64, 80))
    for stage, kind in zip(backbone.stages, backbone.attn_types):
        for block in stage.blocks:
            assert block.uses_pola == (kind == 'L')
            if block.uses_pola:
                assert block.window_size is None and not block.pola_windows
    assert bool((reach > 0).all()), 'a first-stage token misses part of the map'


def test_the_official_windows_reach_one_window():
    """The check above can fail: with the official 56-token windows (the ImageNet configs'
    computation), the same token sees its own window only."""
    cfg = _load('configs/pola_swin/upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py').copy()
    cfg.model.backbone.linear_window_size = 56
    torch.manual_seed(0)
    _, reach = _first_stage_reach(cfg, (64, 80))
    assert bool((reach[:56, :56] > 0).all())
    assert float(reach[56:].sum()) == 0. and float(reach[:, 56:].sum()) == 0.


@pytest.mark.parametrize('path',
                         sorted(glob.glob(osp.join(REPO, 'configs/imagenet/pola-swin-*.py'))))
def test_classifiers_keep_the_official_windows(path):
    """At 224 the whole map is one 56-token window, so the ImageNet configs (the official
    classifier, evaluated at 224 and fine-tuned at 384 / 448 with windows) keep them."""
    backbone = Config.fromfile(path).model.backbone
    assert backbone.get('linear_window_size', 56) == 56
