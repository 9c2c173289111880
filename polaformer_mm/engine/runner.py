"""``PolaRunner``: mmengine's Runner with what this project's tools need.

* Checkpoints are read with ``torch.load(weights_only=True)`` and a scoped allowlist
  (see :mod:`.checkpoint_io`), so ``resume`` and ``load_from`` work under torch >= 2.6
  without switching torch's safety off; checkpoints it writes load weights-only anywhere.
* Resuming restores the random states (:class:`ResumableStateHook`).
* Without CUDA, ``AmpOptimWrapper`` configs train in float32 (a warning says so).
* Distributed training without CUDA: the process group is created with gloo (no
  ``torch.cuda.set_device``), SyncBN layers are reverted to BN, and DDP gets no
  ``device_ids``. With CUDA nothing changes.
"""
import datetime
import os
from typing import Optional

import torch
import torch.distributed as torch_dist
from mmengine.dist import is_distributed
from mmengine.model import is_model_wrapper, revert_sync_batchnorm
from mmengine.registry import MODEL_WRAPPERS, RUNNERS
from mmengine.runner import Runner
from torch.nn.parallel import DistributedDataParallel

from ..utils.mmcv_ops import check_mmcv_cuda_ops
from .checkpoint_io import (require_checkpoint, restore_runner_state,
                            runner_checkpoint_globals)
from .hooks import ResumableStateHook


def _cuda_usable() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


@RUNNERS.register_module()
class PolaRunner(Runner):
    """Drop-in replacement for :class:`mmengine.runner.Runner` (``runner_type='PolaRunner'``)."""

    def __init__(self, *args, **kwargs):
        self._resuming = False
        super().__init__(*args, **kwargs)
        check_mmcv_cuda_ops(self.model)  # on CUDA, mmcv ops must have CUDA kernels
        hooks = [h for h in self._hooks if isinstance(h, ResumableStateHook)]
        if hooks:
            self._state_hook = hooks[0]
        else:
            self._state_hook = ResumableStateHook()
            self.register_hook(self._state_hook)

    # -- distributed set-up ----------------------------------------------------------
    def setup_env(self, env_cfg: dict) -> None:
        if self.distributed and not is_distributed() and not _cuda_usable():
            self._init_cpu_process_group(env_cfg)
        super().setup_env(env_cfg)

    def _init_cpu_process_group(self, env_cfg: dict) -> None:
        if self.launcher != 'pytorch':
            raise RuntimeError(
                f'launcher={self.launcher!r} without CUDA: only the pytorch launcher '
                '(torchrun, tools/dist_train.sh) can train on CPUs; the slurm and mpi '
                'set-ups of mmengine need GPUs')
        missing = [k for k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')
                   if k not in os.environ]
        if missing:
            raise RuntimeError(f'launcher="pytorch" needs the environment variables '
                               f'{missing} that torchrun sets; start with torchrun')
        dist_cfg = dict(env_cfg.get('dist_cfg', {}))
        backend = dist_cfg.pop('backend', 'gloo')
        if backend != 'gloo':
            self._cpu_backend_note = f'dist_cfg.backend={backend!r} needs GPUs; using gloo'
        timeout = dist_cfg.pop('timeout', 1800)
        if not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=timeout)
        torch_dist.init_process_group(backend='gloo', timeout=timeout, **dist_cfg)

    def wrap_model(self, model_wrapper_cfg: Optional[dict], model):
        if not self.distributed or _cuda_usable() or is_model_wrapper(model):
            return super().wrap_model(model_wrapper_cfg, model)
        note = getattr(self, '_cpu_backend_note', None)
        if note:
            self.logger.warning(note)
        if self.cfg.get('sync_bn', None) is not None:
            self.logger.warning('sync_bn is ignored without CUDA (SyncBN needs GPUs)')
        self.logger.info('Distributed training on CPUs: gloo, SyncBN reverted to BN, '
                         'DDP without device_ids')
        model = revert_sync_batchnorm(model.to('cpu'))
        cfg = dict(model_wrapper_cfg or dict(
            type='MMDistributedDataParallel', broadcast_buffers=False,
            find_unused_parameters=self.cfg.get('find_unused_parameters', False)))
        cfg.setdefault('type', 'MMDistributedDataParallel')
        default_args = dict(module=model)
        if issubclass(MODEL_WRAPPERS.get(cfg['type']), DistributedDataParallel):
            default_args['device_ids'] = None
        return MODEL_WRAPPERS.build(cfg, default_args=default_args)

    def build_optim_wrapper(self, optim_wrapper):
        if (isinstance(optim_wrapper, dict) and not _cuda_usable()
                and optim_wrapper.get('type') == 'AmpOptimWrapper'):
            optim_wrapper = dict(optim_wrapper, type='OptimWrapper')
            for key in ('loss_scale', 'dtype', 'use_fsdp'):
                optim_wrapper.pop(key, None)
            self.logger.warning('optim_wrapper.type=AmpOptimWrapper needs CUDA: training '
                                'in float32 with OptimWrapper on this machine')
        return super().build_optim_wrapper(optim_wrapper)

    # -- checkpoints --------------------------------------------------------------
    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys=[(r'^module.', '')]):
        require_checkpoint(filename, 'checkpoint file (load_from / --resume / test)')
        with runner_checkpoint_globals():
            checkpoint = super().load_checkpoint(filename, map_location=map_location,
                                                 strict=strict, revise_keys=revise_keys)
        if 'message_hub' in checkpoint:
            checkpoint['message_hub'] = restore_runner_state(checkpoint['message_hub'])
        if self._resuming:
            if not self._state_hook.set_pending(checkpoint) and checkpoint.get('rng_states'):
                self.logger.warning('the checkpoint holds the random states of a run with '
                                    'another number of processes; they are not restored')
        return checkpoint

    def resume(self, filename: str, *args, **kwargs) -> None:
        self._resuming = True
        try:
            super().resume(filename, *args, **kwargs)
        finally:
            self._resuming = False
