"""tools/train.py and tools/test.py as a user runs them, on a config from outside the repo."""
import glob
import os
import os.path as osp
import pickle
import subprocess
import sys
import textwrap

import pytest

from tests import REPO

pytestmark = pytest.mark.slow

OUTSIDE_CONFIG = '''
# A user's own config: an mmdet base, custom_imports and a Pola backbone, nothing else of ours
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py']
custom_imports = dict(imports=['polaformer_mm'], allow_failed_imports=False)
data_root = '{root}'
classes = ('circle', 'square', 'triangle')
model = dict(
    backbone=dict(_delete_=True, type='PolaPVT', arch='tiny', out_indices=(1, 2, 3)),
    neck=dict(in_channels=[128, 320, 512], start_level=0, num_outs=5),
    bbox_head=dict(num_classes=3))
pipeline_train = [
    dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True), dict(type='PackDetInputs')]
pipeline_test = [
    dict(type='LoadImageFromFile'), dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                          'scale_factor'))]
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False, dataset=dict(
    data_root=data_root, metainfo=dict(classes=classes),
    ann_file='annotations/instances_train.json', data_prefix=dict(img='images/train/'),
    pipeline=pipeline_train))
val_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False, dataset=dict(
    data_root=data_root, metainfo=dict(classes=classes),
    ann_file='annotations/instances_val.json', data_prefix=dict(img='images/val/'),
    pipeline=pipeline_test))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=1, val_interval=1)
optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, weight_decay=1e-4))
default_hooks = dict(logger=dict(interval=1))
'''


def _run(args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS='2')
    proc = subprocess.run(
        [sys.executable] + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def test_outside_config_trains_and_tests(synthetic_data_root, tmp_path):
    cfg = tmp_path / 'my_retinanet_pola.py'
    cfg.write_text(textwrap.dedent(OUTSIDE_CONFIG.format(root=synthetic_data_root)))
    out = _run([osp.join(REPO, 'tools/train.py'), str(cfg), '--work-dir', 'wd'], tmp_path)
    assert 'dataset check: 2 datasets, 0 problems that would stop training' in out
    assert 'Epoch(train) [1][2/2]' in out
    assert 'Epoch(val) [1][2/2]' in out
    ckpt = tmp_path / 'wd' / 'epoch_1.pth'
    assert ckpt.is_file()

    out = _run([
        osp.join(REPO, 'tools/test.py'),
        str(cfg),
        str(ckpt), '--work-dir', 'wt', '--out', 'results.pkl', '--show-dir', 'shown'
    ], tmp_path)
    assert 'Epoch(test) [2/2]' in out
    with open(tmp_path / 'results.pkl', 'rb') as f:
        results = pickle.load(f)
    assert len(results) == 2 and 'pred_instances' in results[0]
    drawn = glob.glob(str(tmp_path / 'wt' / '*' / 'shown' / '*.jpg'))
    assert len(drawn) == 2, drawn


def test_train_rejects_unknown_scope(tmp_path):
    cfg = tmp_path / 'bad.py'
    cfg.write_text("model = dict(type='PolaPVT')\n")
    proc = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools/train.py'),
         str(cfg)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300)
    assert proc.returncode != 0
    assert 'default_scope' in proc.stderr
