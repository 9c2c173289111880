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
from .._smoke import smoke_config

DENSE = sorted(
    p for p in glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True)
    if '_base_' not in p and '/imagenet/' not in p)


def test_dense_configs_found():
    assert len(DENSE) >= 30, DENSE


@pytest.mark.slow
@pytest.mark.parametrize('path', DENSE, ids=lambda p: osp.relpath(p, REPO))
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
