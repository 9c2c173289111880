"""``PolaRunner``: mmengine's Runner with what this project's tools need.

* Checkpoints are read through :func:`polaformer_mm.utils.checkpoint_io.load_checkpoint`
  (weights-only with one scoped allowlist; local files, URLs and mmengine's schemes), so
  ``resume`` and ``load_from`` work under torch >= 2.6 without switching torch's safety
  off; checkpoints it writes load weights-only anywhere.
* Loading is strict: a checkpoint that does not fit the model (``load_from``, test
  checkpoints, ``--resume``) is an error naming the keys and the likely cause
  (:mod:`.checkpoint_fit`), unless the config sets ``allow_partial_load=True``
  (``--allow-partial``). ``--resume`` from a weights-only file says to use ``load_from``;
  ``--resume`` from a checkpoint that does not fit the model (another family, another head
  width) is an error also with ``--allow-partial`` (the optimizer state belongs to the
  checkpoint's parameters), saying to start a new run with ``load_from`` and
  ``--allow-partial``.
* Checkpoints are written atomically, and ``CheckpointHook`` is replaced by
  :class:`~.hooks.PolaCheckpointHook`, which deletes old checkpoints only after the new
  one and ``last_checkpoint`` are complete: a kill at any moment leaves a resumable work
  dir.
* Resuming restores the random states (:class:`ResumableStateHook`); validation between
  a checkpoint and the next step does not change them.
* A loss or gradient norm that is not finite stops training with one message
  (:class:`~.divergence.DivergenceGuardHook`; config ``divergence_guard = False`` turns it
  off); a checkpoint of weights that are not finite is never written, and loading one
  warns.
* A run that raises calls ``after_failed_run`` of the hooks that have one (mmengine calls
  no hook then), which put back what they set for the run: the default attention backend
  of :class:`~.hooks.PolaAttentionBackendHook`, the divergence guard's layer hooks, the
  random states from before a validation that raised.
* One live run per work dir: the runner takes ``<work_dir>/run.lock`` before anything
  is written there (rank 0 of a distributed run) and gives it back when ``train()``,
  ``val()`` or ``test()`` ends; a second run on the same work dir stops at once with
  :class:`~.work_dir_lock.WorkDirLockedError` naming the other run. The lock of a run
  that crashed is stale and taken over (a note names that run).
* The model's neck (or, without one, a segmentor's heads) must take the channels the
  Pola backbone returns: a mismatch is a :class:`~.model_check.ModelConfigError` naming
  both channel lists when the model is built (:func:`~.model_check.check_model_channels`).
* An image that cannot be read or transformed stops training, validation or testing with
  an error naming the file and the reason (:mod:`.image_check`).
* Every head's ``num_classes`` must match the classes of the data a run reads: a mismatch
  is a :class:`~.model_check.ModelConfigError` naming both numbers and config keys before
  training, validation or testing starts (:func:`~.class_check.check_num_classes`).
* Without CUDA, ``AmpOptimWrapper`` configs train in float32 (a warning says so).
* Distributed training without CUDA: the process group is created with gloo (no
  ``torch.cuda.set_device``), SyncBN layers are reverted to BN, and DDP gets no
  ``device_ids``. With CUDA nothing changes.
"""
import datetime
import os
import os.path as osp
import weakref
from typing import Optional

import torch
import torch.distributed as torch_dist
from mmengine.dist import get_rank, is_distributed, master_only
from mmengine.fileio import LocalBackend, get_file_backend
from mmengine.hooks import CheckpointHook
from mmengine.model import is_model_wrapper, revert_sync_batchnorm
from mmengine.registry import HOOKS, MODEL_WRAPPERS, RUNNERS
from mmengine.runner import Runner
from mmengine.runner.checkpoint import _load_checkpoint_to_model
from torch.nn.parallel import DistributedDataParallel

from ..utils.checkpoint_io import CheckpointError, atomic_write, load_checkpoint
from ..utils.mmcv_ops import check_mmcv_cuda_ops
from .checkpoint_fit import (CheckpointMismatchError, check_checkpoint_fits, checkpoint_state_dict,
                             describe_mismatch)
from .class_check import check_count_types, check_num_classes
from .divergence import CONFIG_KEY as DIVERGENCE_GUARD_KEY
from .divergence import DivergenceGuardHook, describe_non_finite, non_finite_tensors
from .hooks import PolaCheckpointHook, ResumableStateHook
from .image_check import name_image_errors
from .model_check import check_model_channels
from .resume_check import (apply_config_values, compare_optimizer, config_values,
                           difference_message, latest_checkpoint, resume_winner)
from .runner_state import restore_runner_state, restore_scheduler_state
from .work_dir_lock import lock_work_dir

_RESUME_KEYS = ('meta', 'state_dict', 'message_hub')


def _cuda_usable() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


@RUNNERS.register_module()
class PolaRunner(Runner):
    """Drop-in replacement for :class:`mmengine.runner.Runner` (``runner_type='PolaRunner'``).

    Args:
        *args: as for :class:`mmengine.runner.Runner`.
        allow_partial_load (bool, optional): load checkpoints that do not fit the model
            (only what fits; a warning names the rest). Default: None, which reads the
            config key ``allow_partial_load`` (False when absent): strict.
        **kwargs: as for :class:`mmengine.runner.Runner`.
    """

    def __init__(self, *args, allow_partial_load: Optional[bool] = None, **kwargs):
        self._resuming = False
        self._allow_partial_load = allow_partial_load
        self._work_dir_lock = None
        self._in_locked_run = False
        super().__init__(*args, **kwargs)
        previous = self._work_dir_lock.previous if self._work_dir_lock else None
        if previous:
            self.logger.warning(f'work dir {self.work_dir}: took over the lock file of a run '
                                'that ended without releasing it (pid '
                                f'{previous.get("pid")} on host {previous.get("host")}, '
                                f'started {previous.get("started")})')
        check_mmcv_cuda_ops(self.model)  # on CUDA, mmcv ops must have CUDA kernels
        if self._allow_partial_load is None:
            self._allow_partial_load = bool(self.cfg.get('allow_partial_load', False))
        hooks = [h for h in self._hooks if isinstance(h, ResumableStateHook)]
        if hooks:
            self._state_hook = hooks[0]
        else:
            self._state_hook = ResumableStateHook()
            self.register_hook(self._state_hook)
        self._guard = next((h for h in self._hooks if isinstance(h, DivergenceGuardHook)), None)
        if self._guard is None and self.cfg.get(DIVERGENCE_GUARD_KEY, True):
            self._guard = DivergenceGuardHook()
            self.register_hook(self._guard)

    # -- distributed set-up ----------------------------------------------------------
    def setup_env(self, env_cfg: dict) -> None:
        """mmengine's set-up; without CUDA a distributed run gets a gloo group first."""
        if self.distributed and not is_distributed() and not _cuda_usable():
            self._init_cpu_process_group(env_cfg)
        super().setup_env(env_cfg)
        # the work dir exists, nothing is written into it yet
        self._lock_work_dir()

    # -- one live run per work dir ----------------------------------------------------
    def _lock_work_dir(self) -> None:
        if self._work_dir_lock is not None or get_rank() != 0:
            return
        self._work_dir_lock = lock_work_dir(self.work_dir)
        weakref.finalize(self, self._work_dir_lock.release)

    def _unlock_work_dir(self) -> None:
        lock, self._work_dir_lock = self._work_dir_lock, None
        if lock is not None:
            lock.release()

    def _locked_run(self, run):
        outermost = not self._in_locked_run  # e.g. a hook calling val() inside train()
        self._lock_work_dir()
        self._in_locked_run = True
        try:
            return run()
        except BaseException:
            if outermost:
                self._after_failed_run()
            raise
        finally:
            if outermost:
                self._in_locked_run = False
                self._unlock_work_dir()

    def _after_failed_run(self) -> None:
        """mmengine calls no hook when a run raises: the hooks that set state for the run
        (``after_failed_run``: the attention backend, the divergence guard's layer hooks,
        the random states saved when a validation started) put it back here."""
        for hook in self._hooks:
            undo = getattr(hook, 'after_failed_run', None)
            if callable(undo):
                try:
                    undo(self)
                except Exception as err:  # the run's own error is the one to raise
                    self.logger.warning(f'{type(hook).__name__}.after_failed_run: {err}')

    def train(self):
        """mmengine's ``train()``, holding the work dir's lock (released at the end); an
        error of the Pola op about inputs that are not finite becomes a
        :class:`~.divergence.TrainingDivergedError` naming the layer."""
        check_num_classes(self.model, self.cfg, ('train', 'val'))
        try:
            return self._locked_run(super().train)
        except ValueError as err:
            diverged = self._guard.explain(self, err) if self._guard is not None else None
            if diverged is None:
                raise
            raise diverged from err

    def val(self):
        """mmengine's ``val()``, holding the work dir's lock (released at the end)."""
        check_num_classes(self.model, self.cfg, ('val', ))
        return self._locked_run(super().val)

    def test(self):
        """mmengine's ``test()``, holding the work dir's lock (released at the end)."""
        check_num_classes(self.model, self.cfg, ('test', ))
        return self._locked_run(super().test)

    def _init_cpu_process_group(self, env_cfg: dict) -> None:
        if self.launcher != 'pytorch':
            raise RuntimeError(
                f'launcher={self.launcher!r} without CUDA: only the pytorch launcher '
                '(torchrun, tools/dist_train.sh) can train on CPUs; the slurm and mpi '
                'set-ups of mmengine need GPUs')
        missing = [
            k for k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT') if k not in os.environ
        ]
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

    def build_model(self, model):
        """mmengine's ``build_model``, then :func:`~.model_check.check_model_channels`; a
        class count of the model config that is not an int is named first
        (:func:`~.class_check.check_count_types`)."""
        if isinstance(model, dict) and isinstance(self.cfg.get('model'), dict):
            check_count_types(self.cfg)
        model = super().build_model(model)
        check_model_channels(model)
        return model

    def wrap_model(self, model_wrapper_cfg: Optional[dict], model):
        """mmengine's DDP wrapping; without CUDA: SyncBN reverted, no ``device_ids``."""
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
        cfg = dict(
            model_wrapper_cfg or dict(
                type='MMDistributedDataParallel',
                broadcast_buffers=False,
                find_unused_parameters=self.cfg.get('find_unused_parameters', False)))
        cfg.setdefault('type', 'MMDistributedDataParallel')
        default_args = dict(module=model)
        if issubclass(MODEL_WRAPPERS.get(cfg['type']), DistributedDataParallel):
            default_args['device_ids'] = None
        return MODEL_WRAPPERS.build(cfg, default_args=default_args)

    @staticmethod
    def build_dataloader(dataloader, *args, **kwargs):
        """mmengine's, with the dataset's pipeline naming images that cannot be read or
        transformed (:func:`~.image_check.name_image_errors`)."""
        loader = Runner.build_dataloader(dataloader, *args, **kwargs)
        name_image_errors(getattr(loader, 'dataset', None))
        return loader

    def build_optim_wrapper(self, optim_wrapper):
        """mmengine's optimizer wrapper; ``AmpOptimWrapper`` falls back to float32
        without CUDA (with a warning)."""
        if (isinstance(optim_wrapper, dict) and not _cuda_usable()
                and optim_wrapper.get('type') == 'AmpOptimWrapper'):
            optim_wrapper = dict(optim_wrapper, type='OptimWrapper')
            for key in ('loss_scale', 'dtype', 'use_fsdp'):
                optim_wrapper.pop(key, None)
            self.logger.warning('optim_wrapper.type=AmpOptimWrapper needs CUDA: training '
                                'in float32 with OptimWrapper on this machine')
        return super().build_optim_wrapper(optim_wrapper)

    # -- hooks --------------------------------------------------------------------
    def register_hook(self, hook, priority=None) -> None:
        """As mmengine's, but a ``CheckpointHook`` config builds a
        :class:`~.hooks.PolaCheckpointHook` (same arguments, kill-safe order)."""
        if isinstance(hook, dict):
            hook_type = hook.get('type')
            if isinstance(hook_type, str):
                hook_type = HOOKS.get(hook_type)
            if hook_type is CheckpointHook:
                hook = dict(hook, type=PolaCheckpointHook)
        elif type(hook) is CheckpointHook:
            self.logger.warning('a built CheckpointHook deletes old checkpoints before the '
                                'new one is written; pass it as a config dict (or use '
                                'PolaCheckpointHook) for kill-safe checkpoints')
        super().register_hook(hook, priority)

    # -- checkpoints --------------------------------------------------------------
    @master_only
    def save_checkpoint(self,
                        out_dir: str,
                        filename: str,
                        file_client_args=None,
                        *args,
                        backend_args=None,
                        **kwargs):
        """As mmengine's, but a local checkpoint is written to a temporary file in
        ``out_dir``, flushed to disk and renamed to ``filename``: the file is either
        absent or complete, whenever the process dies."""
        if file_client_args is not None or not isinstance(
                get_file_backend(out_dir, backend_args=backend_args), LocalBackend):
            return super().save_checkpoint(
                out_dir, filename, file_client_args, *args, backend_args=backend_args, **kwargs)
        save = super().save_checkpoint
        os.makedirs(out_dir, exist_ok=True)
        atomic_write(
            osp.join(out_dir, filename),
            lambda tmp: save(osp.dirname(tmp), osp.basename(tmp), None, *args, **kwargs))

    def load_checkpoint(self,
                        filename: str,
                        map_location='cpu',
                        strict: Optional[bool] = None,
                        revise_keys=[(r'^module.', '')]):
        """Load ``filename`` into the model (see the class notes).

        Args:
            filename (str): local path, URL or another mmengine scheme.
            map_location: as for :func:`torch.load`. Default: 'cpu'.
            strict (bool, optional): error when the checkpoint does not fit the model
                exactly. Default: None, meaning strict unless partial loading is allowed
                (``allow_partial_load``).
            revise_keys (list): (pattern, replacement) pairs applied to the checkpoint's
                keys. Default: strip ``module.``.

        Returns:
            dict: the checkpoint.
        """
        what = '--resume checkpoint' if self._resuming else 'checkpoint'
        checkpoint = load_checkpoint(filename, map_location=map_location, what=what)
        if not isinstance(checkpoint, dict):
            raise CheckpointError(f'{what} {filename!r} holds a '
                                  f'{type(checkpoint).__name__}, not a dict of tensors')
        model = self.model.module if is_model_wrapper(self.model) else self.model
        source = f'{what} {filename!r}'
        if self._resuming:
            self._require_resumable(checkpoint, filename)
            self._require_same_model(model, checkpoint, source, filename, revise_keys)
            self._compare_optimizer(checkpoint, filename)
        self._warn_non_finite(checkpoint, filename)
        if 'message_hub' in checkpoint:
            checkpoint['message_hub'] = restore_runner_state(checkpoint['message_hub'])
        if 'param_schedulers' in checkpoint:
            checkpoint['param_schedulers'] = restore_scheduler_state(checkpoint['param_schedulers'])
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)

        strict = not self._allow_partial_load if strict is None else strict
        if strict:
            check_checkpoint_fits(model, checkpoint, source, revise_keys)
        else:
            message = describe_mismatch(model, checkpoint_state_dict(checkpoint, revise_keys),
                                        source)
            if message:
                self.logger.warning(f'{message}\nLoading only what fits (partial loading '
                                    'is allowed).')
        _load_checkpoint_to_model(
            model, checkpoint, strict=False, logger=self.logger, revise_keys=revise_keys)
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')

        if self._resuming:
            if not self._state_hook.set_pending(checkpoint) and checkpoint.get('rng_states'):
                self.logger.warning('the checkpoint holds the random states of a run with '
                                    'another number of processes; they are not restored')
        return checkpoint

    def _warn_non_finite(self, checkpoint: dict, filename: str) -> None:
        state = checkpoint.get('state_dict', checkpoint)
        bad = non_finite_tensors(state) if isinstance(state, dict) else []
        if bad:
            self.logger.warning(
                f'checkpoint {filename} holds weights that are not finite (NaN or infinity): '
                f'{describe_non_finite(bad, len(state))}; it was written by a run that '
                'diverged, and what it predicts or trains from it is meaningless')

    @staticmethod
    def _require_resumable(checkpoint: dict, filename: str) -> None:
        meta = checkpoint.get('meta')
        missing = [k for k in _RESUME_KEYS if k not in checkpoint]
        if isinstance(meta, dict):
            missing += [f"meta['{k}']" for k in ('epoch', 'iter') if k not in meta]
        if missing:
            raise CheckpointError(
                f'--resume: {filename!r} is not a checkpoint of a training run (it has no '
                f'{", ".join(missing)}; it holds weights only, e.g. a converted or '
                'published file), so there is no run to resume. To start training from its '
                f'weights use load_from instead: --cfg-options load_from={filename} without '
                "--resume (backbone weights: model.backbone.init_cfg=dict(type='Pretrained', "
                'checkpoint=...)).')

    @staticmethod
    def _require_same_model(model, checkpoint: dict, source: str, filename: str,
                            revise_keys) -> None:
        """A resumed run continues the optimizer state and schedule of the checkpoint's
        parameters: a model they do not fit cannot resume (``--allow-partial`` or not);
        the error says how to start a new run from the weights that fit."""
        message = describe_mismatch(model, checkpoint_state_dict(checkpoint, revise_keys), source)
        if message:
            raise CheckpointMismatchError(
                f'{message}\nA run resumes only the model it was saved from (its optimizer '
                'state and schedule belong to those parameters), with or without '
                '--allow-partial. To train this model from the weights of the checkpoint '
                f'that fit it, start a new run: --cfg-options load_from={filename} '
                '--allow-partial without --resume (the optimizer state and the schedule '
                'start over).')

    def _compare_optimizer(self, checkpoint: dict, filename: str) -> None:
        """Before mmengine restores the optimizer: another optimizer type is an error;
        another lr / weight decay is reported (and, with ``resume_optimizer_from='config'``,
        put back after the resume)."""
        winner = resume_winner(self.cfg)
        differences, _ = compare_optimizer(self.optim_wrapper, checkpoint, filename)
        self._config_optimizer_values = config_values(self.optim_wrapper) if differences and \
            winner == 'config' else None
        if differences:
            self.logger.warning(difference_message(differences, filename, winner))

    def resume(self, filename: str, *args, **kwargs) -> None:
        """mmengine's resume, which also restores the random states of ``filename`` and
        compares the optimizer with the checkpoint's (:mod:`.resume_check`)."""
        self._resuming = True
        self._config_optimizer_values = None
        try:
            super().resume(filename, *args, **kwargs)
        finally:
            self._resuming = False
        if self._config_optimizer_values:
            apply_config_values(self.optim_wrapper, self.param_schedulers,
                                self._config_optimizer_values)

    def load_or_resume(self) -> None:
        """mmengine's, but ``--resume`` without a checkpoint reads ``last_checkpoint``
        inside the work dir (a copied or moved work dir resumes from its own files)."""
        if not self._has_loaded and self._resume and self._load_from is None:
            path, note = latest_checkpoint(self.work_dir)
            if note:
                self.logger.warning(note)
            if path:
                self.logger.info(f'Resuming from the latest checkpoint {path}')
                self._load_from = path
        return super().load_or_resume()
