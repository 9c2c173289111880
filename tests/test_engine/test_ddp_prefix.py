"""Checkpoints saved from a DDP-wrapped model (every key ``module.*``) load wherever a
checkpoint is read, as mmengine's loader takes them: ``init_cfg`` Pretrained,
``load_from`` / tools/test.py's checkpoint (the converter:
tests/test_tools/test_official2mm.py; the demo: tests/test_tools/test_image_demo.py)."""
import os.path as osp

import pytest
import torch
from mmengine.registry import init_default_scope

from polaformer_mm.engine import entry
from tests import REPO
from .._ddp import ddp_state_dict
from .._smoke import smoke_config

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')


def _detector():
    from mmdet.registry import MODELS
    init_default_scope('mmdet')
    model = MODELS.build(entry.load_config(DET).model)
    model.init_weights()
    return model


@pytest.mark.parametrize('saved', ['backbone', 'whole detector'])
def test_init_cfg_pretrained_reads_a_ddp_saved_file(saved, tmp_path):
    from mmdet.registry import MODELS
    detector = _detector()
    path = str(tmp_path / 'ddp.pth')
    if saved == 'backbone':  # torch.save(ddp.state_dict()) of a bare backbone
        torch.save(ddp_state_dict(detector.backbone), path)
    else:  # a whole-model checkpoint whose keys are module.backbone.*, module.neck.*, ...
        torch.save({'state_dict': ddp_state_dict(detector)}, path)
    cfg = entry.load_config(DET).model.backbone
    cfg.init_cfg = dict(type='Pretrained', checkpoint=path)
    backbone = MODELS.build(cfg)
    backbone.init_weights()
    want = detector.backbone.state_dict()
    got = backbone.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.slow
def test_test_checkpoint_and_load_from_read_a_ddp_saved_file(synthetic_data_root, tmp_path):
    detector = _detector()
    ckpt = str(tmp_path / 'ddp_detector.pth')
    torch.save({'state_dict': ddp_state_dict(detector), 'meta': {}}, ckpt)

    cfg = entry.load_config(DET)
    smoke_config(cfg, synthetic_data_root, tmp_path / 'test')
    entry.prepare_test_config(cfg, DET, ckpt, work_dir=str(tmp_path / 'test'))
    runner = entry.build_runner(cfg)  # strict: every key must fit once module. is gone
    assert runner.test() is not None
    want, got = detector.state_dict(), runner.model.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)
