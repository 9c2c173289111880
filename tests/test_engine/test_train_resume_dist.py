"""tools/train.py paths through PolaRunner: resume, torchrun on CPUs, named errors."""
import glob
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from polaformer_mm.engine import entry
from tests import REPO

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
SEG = osp.join(REPO, 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py')


class _Interrupted(RuntimeError):
    pass


@HOOKS.register_module(force=True)
class _StopAfterEpochHook(Hook):
    """Simulates a crash right after the checkpoint of epoch ``epoch`` is written."""
    priority = 'LOWEST'

    def __init__(self, epoch):
        self.epoch = epoch

    def after_train_epoch(self, runner):
        if runner.epoch + 1 == self.epoch:
            raise _Interrupted(f'stopped after epoch {self.epoch}')


def _det_cfg(data_root, work_dir, resume=None, extra_hooks=()):
    cfg = entry.load_config(DET)
    opts = {
        'train_dataloader.dataset.data_root': data_root,
        'val_dataloader.dataset.data_root': data_root,
        'test_dataloader.dataset.data_root': data_root,
        'val_evaluator.ann_file': data_root + 'annotations/instances_val.json',
        'test_evaluator.ann_file': data_root + 'annotations/instances_val.json',
        'train_dataloader.batch_size': 2,
        'train_cfg.max_epochs': 2,
        'train_cfg.val_interval': 100,
        'default_hooks.checkpoint.interval': 1,
        'default_hooks.checkpoint.max_keep_ckpts': 3,
        'default_hooks.logger.interval': 1,
        # RandomFlip and the samplers draw random numbers: the resumed run must restore them
        'randomness': dict(seed=123, deterministic=True),
    }
    cfg.merge_from_dict(opts)
    cfg.custom_hooks = list(extra_hooks)
    entry.prepare_train_config(cfg, DET, work_dir=str(work_dir), resume=resume)
    return cfg


def _weights(path):
    state = torch.load(path, map_location='cpu', weights_only=True)  # plain, no allowlist
    return state['state_dict']


@pytest.mark.slow
def test_resume_matches_uninterrupted_run(synthetic_data_root, tmp_path):
    straight = tmp_path / 'straight'
    entry.build_runner(_det_cfg(synthetic_data_root, straight)).train()

    broken = tmp_path / 'broken'
    with pytest.raises(_Interrupted):
        entry.build_runner(
            _det_cfg(
                synthetic_data_root,
                broken,
                extra_hooks=[dict(type='_StopAfterEpochHook', epoch=1)])).train()
    assert osp.isfile(broken / 'epoch_1.pth') and not osp.isfile(broken / 'epoch_2.pth')

    runner = entry.build_runner(_det_cfg(synthetic_data_root, broken, resume='auto'))
    runner.train()
    assert runner.epoch == 2
    a, b = _weights(straight / 'epoch_2.pth'), _weights(broken / 'epoch_2.pth')
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f'{len(differ)} tensors differ, e.g. {differ[:3]}'
    # and the first epoch did change the weights (the comparison is not vacuous)
    c = _weights(straight / 'epoch_1.pth')
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_resume_from_explicit_checkpoint_and_missing_one(synthetic_data_root, tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        _det_cfg(synthetic_data_root, tmp_path, resume=str(tmp_path / 'nope.pth'))


def test_missing_pretrained_checkpoint_is_named(synthetic_data_root, tmp_path):
    cfg = _det_cfg(synthetic_data_root, tmp_path)
    cfg.model.backbone.init_cfg = dict(
        type='Pretrained', checkpoint='checkpoints/no_such_pola_pvt_t.pth')
    runner = entry.build_runner(cfg)
    with pytest.raises(FileNotFoundError, match='no_such_pola_pvt_t.pth'):
        runner.train()


def test_wrong_backbone_argument_is_named(synthetic_data_root, tmp_path):
    cfg = _det_cfg(synthetic_data_root, tmp_path)
    cfg.model.backbone.windw_size = 7
    with pytest.raises(TypeError, match='windw_size'):
        entry.build_runner(cfg)


def test_wrong_arch_is_named(synthetic_data_root, tmp_path):
    cfg = _det_cfg(synthetic_data_root, tmp_path)
    cfg.model.backbone.arch = 'huge'
    with pytest.raises(Exception, match='huge'):
        entry.build_runner(cfg)


def test_test_tool_missing_checkpoint(tmp_path):
    cfg = entry.load_config(DET)
    with pytest.raises(FileNotFoundError, match='missing.pth'):
        entry.prepare_test_config(cfg, DET, str(tmp_path / 'missing.pth'))


def test_amp_needs_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip('CUDA machine')
    cfg = entry.load_config(DET)
    with pytest.raises(RuntimeError, match='--amp needs a CUDA'):
        entry.prepare_train_config(cfg, DET, work_dir=str(tmp_path), amp=True)


@pytest.mark.slow
def test_torchrun_two_processes_on_cpu(synthetic_data_root, tmp_path):
    """tools/dist_train.sh: 2 processes (gloo), SyncBN reverted, a few iterations."""
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        PORT=str(29500 + os.getpid() % 1000),
        OMP_NUM_THREADS='1')
    env.pop('CUDA_VISIBLE_DEVICES', None)
    cmd = [
        'bash',
        osp.join(REPO, 'tools/dist_train.sh'), SEG, '2', '--work-dir',
        str(tmp_path / 'wd'), '--cfg-options',
        f'train_dataloader.dataset.data_root={synthetic_data_root}',
        f'val_dataloader.dataset.data_root={synthetic_data_root}', 'train_dataloader.batch_size=2',
        'train_cfg.max_iters=3', 'train_cfg.val_interval=3', 'default_hooks.checkpoint.interval=3',
        'default_hooks.logger.interval=1', 'model.decode_head.norm_cfg.type=SyncBN',
        'env_cfg.dist_cfg.backend=nccl'
    ]
    proc = subprocess.run(
        cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert 'Distributed training on CPUs' in out, out[-2000:]
    assert 'Distributed training: True' in out, out[-2000:]
    assert 'mIoU' in out
    ckpts = glob.glob(str(tmp_path / 'wd' / 'iter_3.pth'))
    assert ckpts, os.listdir(tmp_path / 'wd')
    state = torch.load(ckpts[0], map_location='cpu', weights_only=True)  # no allowlist
    assert state['meta']['iter'] == 3
    assert 'SyncBN reverted to BN' in out
    # rank 0 held the work dir's lock (rank 1 was not refused) and gave it back
    assert not (tmp_path / 'wd' / 'run.lock').exists()
