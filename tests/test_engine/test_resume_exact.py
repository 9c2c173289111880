"""Exact resume with validation between the checkpoint and the next training step.

Validation draws from torch's global generator (a DataLoader iterator draws its base
seed), and the RoI samplers of the detector draw from it in training: a resumed run must
still end with the uninterrupted run's weights, bit for bit (one thread).
"""
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from polaformer_mm.engine import entry
from tests import REPO

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')

pytestmark = pytest.mark.slow


class _Interrupted(RuntimeError):
    pass


@HOOKS.register_module(force=True)
class _StopAfterCheckpointHook(Hook):
    """Stops training right after the checkpoint of epoch (or iteration) ``step``."""
    priority = 'LOWEST'

    def __init__(self, step, by_epoch=True):
        self.step, self.by_epoch = step, by_epoch

    def after_train_epoch(self, runner):
        if self.by_epoch and runner.epoch + 1 == self.step:
            raise _Interrupted(f'stopped after epoch {self.step}')

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if not self.by_epoch and runner.iter + 1 == self.step:
            raise _Interrupted(f'stopped after iteration {self.step}')


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _cfg(data_root, work_dir, by_epoch, resume=None, stop=None):
    cfg = entry.load_config(DET)
    ann = data_root + 'annotations/instances_val.json'
    opts = {
        'train_dataloader.dataset.data_root': data_root,
        'val_dataloader.dataset.data_root': data_root,
        'test_dataloader.dataset.data_root': data_root,
        'val_dataloader.dataset.indices': 1,
        'val_evaluator.ann_file': ann,
        'test_evaluator.ann_file': ann,
        'train_dataloader.batch_size': 2,
        'default_hooks.logger.interval': 1,
        'default_hooks.checkpoint.max_keep_ckpts': 3,
        'randomness': dict(seed=123, deterministic=True),
    }
    if by_epoch:  # 2 epochs of 1 iteration, validation after each
        opts.update({
            'train_dataloader.dataset.indices': 2,
            'train_cfg': dict(max_epochs=2, val_interval=1),
            'default_hooks.checkpoint.interval': 1,
        })
    else:  # 4 iterations, a checkpoint every 2, validation after each
        opts.update({
            'train_dataloader.dataset.indices':
            4,
            'train_dataloader.sampler':
            dict(type='InfiniteSampler', shuffle=True),
            'param_scheduler':
            [dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0, end=4)],
            'default_hooks.checkpoint':
            dict(type='CheckpointHook', by_epoch=False, interval=2, max_keep_ckpts=3),
            'log_processor':
            dict(by_epoch=False),
        })
    cfg.merge_from_dict(opts)
    if not by_epoch:
        cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=4, val_interval=1)
    if stop:
        cfg.custom_hooks = [dict(type='_StopAfterCheckpointHook', step=stop, by_epoch=by_epoch)]
    entry.prepare_train_config(cfg, DET, work_dir=str(work_dir), resume=resume)
    return cfg


def _weights(path):
    return torch.load(path, map_location='cpu', weights_only=True)['state_dict']


def _assert_same_weights(a_path, b_path, first_path):
    a, b = _weights(a_path), _weights(b_path)
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f'{len(differ)} of {len(a)} tensors differ, e.g. {differ[:3]}'
    first = _weights(first_path)  # training went on after the checkpoint: not vacuous
    assert any(not torch.equal(a[k], first[k]) for k in a)


@pytest.mark.parametrize('by_epoch', [True, False], ids=['epoch-based', 'iter-based'])
def test_resume_with_validation_between_matches_uninterrupted_run(synthetic_data_root, tmp_path,
                                                                  by_epoch, one_thread):
    data_root = synthetic_data_root
    straight, broken = tmp_path / 'straight', tmp_path / 'broken'
    entry.build_runner(_cfg(data_root, straight, by_epoch)).train()

    with pytest.raises(_Interrupted):
        entry.build_runner(_cfg(data_root, broken, by_epoch, stop=2 if not by_epoch else 1)).train()
    first, last = ('epoch_1.pth', 'epoch_2.pth') if by_epoch else ('iter_2.pth', 'iter_4.pth')
    assert osp.isfile(broken / first) and not osp.isfile(broken / last)

    runner = entry.build_runner(_cfg(data_root, broken, by_epoch, resume='auto'))
    runner.train()
    assert (runner.epoch, runner.iter)[not by_epoch] == (2 if by_epoch else 4)
    _assert_same_weights(straight / last, broken / last, straight / first)
