"""What ``tools/train.py`` and ``tools/test.py`` do, as functions (tests call them too).

Both take any config of the project (mmdet, mmseg or mmpretrain, told apart by the
config's ``default_scope``) and run it with :class:`~.runner.PolaRunner`.
"""
import os
import os.path as osp
from typing import Optional

import torch
from mmengine.config import Config

from ..utils.checkpoint_io import require_checkpoint

TASKS = ('mmdet', 'mmseg', 'mmpretrain')


def task_of(cfg: Config) -> str:
    scope = cfg.get('default_scope')
    if scope not in TASKS:
        raise ValueError(f'config default_scope={scope!r}: expected one of {TASKS} '
                         '(inherit a mmdet::, mmseg:: or mmpretrain:: base config)')
    return scope


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    task_of(cfg)
    return cfg


def _common(cfg: Config, config_path: str, work_dir: Optional[str], launcher: str,
            allow_partial: bool = False) -> None:
    cfg.launcher = launcher
    if allow_partial:
        cfg.allow_partial_load = True
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])
    cfg.setdefault('runner_type', 'PolaRunner')


def prepare_train_config(cfg: Config, config_path: str, work_dir: Optional[str] = None,
                         resume=None, amp: bool = False, auto_scale_lr: bool = False,
                         launcher: str = 'none', allow_partial: bool = False) -> Config:
    """Apply the command-line choices of ``tools/train.py`` to ``cfg``.

    ``resume``: None (no resume), 'auto' (latest checkpoint of the work dir, if any) or a
    checkpoint path. ``allow_partial``: ``load_from`` / ``--resume`` load only what fits
    (``allow_partial_load=True``) instead of stopping on a checkpoint that does not fit.
    """
    _common(cfg, config_path, work_dir, launcher, allow_partial)
    if amp:
        if not torch.cuda.is_available():
            raise RuntimeError('--amp needs a CUDA device (mmengine AmpOptimWrapper)')
        opt_type = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if opt_type == 'OptimWrapper':
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
        elif opt_type != 'AmpOptimWrapper':
            raise ValueError(f'--amp with optim_wrapper.type={opt_type!r}: only '
                             'OptimWrapper can be switched to AmpOptimWrapper')
    if auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise KeyError('--auto-scale-lr: the config has no auto_scale_lr.base_batch_size')
        cfg.auto_scale_lr.enable = True
    if resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif resume is not None:
        require_checkpoint(resume, '--resume checkpoint')
        cfg.resume = True
        cfg.load_from = resume
    return cfg


def prepare_test_config(cfg: Config, config_path: str, checkpoint: str,
                        work_dir: Optional[str] = None, out: Optional[str] = None,
                        show: bool = False, show_dir: Optional[str] = None,
                        wait_time: float = 2., launcher: str = 'none',
                        allow_partial: bool = False) -> Config:
    """Apply the command-line choices of ``tools/test.py`` to ``cfg``."""
    require_checkpoint(checkpoint, 'checkpoint file')
    _common(cfg, config_path, work_dir, launcher, allow_partial)
    cfg.load_from = checkpoint
    task = task_of(cfg)
    if show or show_dir:
        _enable_visualization(cfg, task, show, show_dir, wait_time)
    if out is not None:
        _dump_results(cfg, task, out)
    return cfg


def _enable_visualization(cfg, task, show, show_dir, wait_time):
    hooks = cfg.get('default_hooks', {})
    vis = hooks.get('visualization')
    if vis is None:
        raise KeyError('--show/--show-dir need default_hooks.visualization in the config')
    if task == 'mmdet':
        vis.update(draw=True, show=show, wait_time=wait_time)
        if show_dir:
            vis.test_out_dir = show_dir
    elif task == 'mmseg':  # its hook draws every `interval`-th image (50 by default)
        vis.update(draw=True, show=show, wait_time=wait_time, interval=1)
        if show_dir:
            cfg.visualizer.save_dir = show_dir
    else:
        vis.update(enable=True, show=show, wait_time=wait_time, interval=1)
        if show_dir:
            vis.out_dir = show_dir


def _dump_results(cfg, task, out):
    if task == 'mmseg':
        # mmseg writes one prediction PNG per image into a folder
        cfg.test_evaluator = dict(cfg.test_evaluator, output_dir=out, keep_results=True)
        return
    if not out.endswith(('.pkl', '.pickle')):
        raise ValueError(f'--out {out!r}: the results file must be a .pkl/.pickle')
    dump = dict(type='DumpDetResults' if task == 'mmdet' else 'DumpResults', out_file_path=out)
    evaluators = cfg.test_evaluator
    if isinstance(evaluators, (list, tuple)):
        cfg.test_evaluator = list(evaluators) + [dump]
    else:
        cfg.test_evaluator = [evaluators, dump]


def build_runner(cfg: Config):
    """Build the runner named by ``cfg.runner_type`` in the config's scope."""
    from mmengine.registry import RUNNERS
    return RUNNERS.build(cfg)


def finish(succeeded: bool = True) -> None:
    """Leave a distributed run cleanly: after a successful run every rank waits for the
    others (rank 0 may still be writing the last checkpoint) before the group is torn
    down, so no rank exits while a peer still talks to it."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if succeeded:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def setup_local_rank(local_rank: Optional[int]) -> None:
    if 'LOCAL_RANK' not in os.environ and local_rank is not None:
        os.environ['LOCAL_RANK'] = str(local_rank)
