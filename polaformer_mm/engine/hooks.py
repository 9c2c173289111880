"""Hooks the project's runner installs."""
import os.path as osp
import random
from typing import Iterable, List, Tuple

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size, is_main_process
from mmengine.hooks import CheckpointHook, Hook
from mmengine.registry import HOOKS

from ..ops import BACKENDS, set_default_backend
from ..utils.checkpoint_io import atomic_write
from .runner_state import to_weights_only_safe


def _rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = dict(
        python=random.getstate(),
        numpy=dict(
            kind=kind,
            keys=torch.from_numpy(keys.astype(np.int64)),
            pos=int(pos),
            has_gauss=int(has_gauss),
            cached_gaussian=float(cached)),
        torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state['python'])
    n = state['numpy']
    np.random.set_state((n['kind'], n['keys'].numpy().astype(np.uint32), n['pos'], n['has_gauss'],
                         n['cached_gaussian']))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


@HOOKS.register_module()
class ResumableStateHook(Hook):
    """Makes checkpoints weights-only loadable and resumable to the same random state.

    Before a checkpoint is written, it stores the Python, numpy, torch (and CUDA) random
    states under ``checkpoint['rng_states']`` (of every rank when an epoch-based
    distributed run saves at an epoch end) and converts the message hub and meta to
    weights-only loadable data. When the runner resumes from such a checkpoint, the
    states are put back where the uninterrupted run would continue from them:

    * epoch-based loops: at the start of the next training epoch;
    * iteration-based loops: after the loop has re-read the batches it skips, just
      before the first batch that is trained again.

    So that the uninterrupted run continues from the same states, whatever runs between
    a training step and the next one does not change the training's random streams:

    * validation (and what runs inside it: visualisers, metrics) is transparent: the
      states are saved when it starts and put back when it ends (iterating a
      DataLoader draws a seed from torch's global generator, for instance);
    * an epoch-based loop starts every epoch from the states recorded at the end of
      the previous one (the states its checkpoint holds), whatever hooks drew in between.

    A run resumed from a checkpoint then ends with the weights of the uninterrupted run,
    bit for bit, on one thread with ``num_workers=0`` or fresh workers per epoch (worker
    processes that persist across epochs, or the workers of an iteration-based loop, keep
    random states of their own that no checkpoint holds).
    """

    # before CheckpointHook (VERY_LOW) in after_train_epoch; after the hooks that add
    # to a checkpoint (NORMAL) in before_save_checkpoint
    priority = 'LOW'

    def __init__(self) -> None:
        self._pending = None
        self._gathered = None
        self._epoch_end = None  # (epoch, this rank's states) between two epochs
        self._before_val = []  # states saved when a validation started (nested: a stack)

    def after_train_epoch(self, runner) -> None:
        """Record the random states the next epoch starts from (gathered from every rank
        before rank 0 saves the checkpoint)."""
        state = _rng_state()
        self._epoch_end = (runner.epoch, state)
        # Runner.save_checkpoint runs on rank 0 only, so the ranks' states are collected
        # here, where every rank passes, just before CheckpointHook saves
        if get_world_size() > 1:
            self._gathered = (runner.epoch, all_gather_object(state))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Store the random states and make the checkpoint weights-only loadable."""
        if get_world_size() == 1:
            checkpoint['rng_states'] = [self._training_state()]
        elif self._gathered is not None and self._gathered[0] == runner.epoch:
            checkpoint['rng_states'] = self._gathered[1]
        self._gathered = None
        optimizer = getattr(runner.optim_wrapper, 'optimizer', None)
        if optimizer is not None and isinstance(checkpoint.get('meta'), dict):
            checkpoint['meta']['optimizer_type'] = type(optimizer).__name__
        for key in ('meta', 'message_hub', 'param_schedulers'):
            if key in checkpoint:
                checkpoint[key] = to_weights_only_safe(checkpoint[key])

    def _training_state(self) -> dict:
        """The random states training continues from: between two epochs those recorded
        at the end of the first, during a validation those from before it."""
        if self._epoch_end is not None:
            return self._epoch_end[1]
        return self._before_val[0] if self._before_val else _rng_state()

    def set_pending(self, checkpoint: dict) -> bool:
        """Remember the random states of ``checkpoint`` for where training continues;
        False when it holds none for this number of processes."""
        states = checkpoint.get('rng_states')
        ok = bool(states) and len(states) == get_world_size()
        self._pending = states[get_rank()] if ok else None
        return ok

    def before_train_epoch(self, runner) -> None:
        """Put back the random states training continues from: those of the checkpoint
        a run resumed from, or those recorded at the end of the previous epoch."""
        pending, self._pending = self._pending, None
        epoch_end, self._epoch_end = self._epoch_end, None
        loop = runner.train_loop
        if pending is not None and runner.iter > 0 and hasattr(loop, 'dataloader_iterator'):
            # an iteration-based loop re-reads runner.iter batches before it trains again
            loop.dataloader_iterator = _RestoreAfterSkip(loop, runner.iter, pending)
        elif pending is not None:
            _set_rng_state(pending)
        elif epoch_end is not None:
            _set_rng_state(epoch_end[1])

    def before_val(self, runner) -> None:
        """Save the random states: validation does not change the training's."""
        self._before_val.append(_rng_state())

    def after_val(self, runner) -> None:
        """Put back the random states saved when validation started."""
        if self._before_val:
            _set_rng_state(self._before_val.pop())

    def after_failed_run(self, runner) -> None:
        """A validation that raised (:class:`~.runner.PolaRunner` calls this): put back the
        random states from before it, as ``after_val`` would have, so that no later
        checkpoint of this runner records the failed validation's."""
        if self._before_val:
            _set_rng_state(self._before_val[0])
            self._before_val.clear()


class _RestoreAfterSkip:
    """Stands in for an iteration-based loop's data iterator while it re-reads the
    ``skip`` batches that a resumed run skips, then puts back the random states of the
    checkpoint, just before the next batch is read, and gives the loop its iterator back."""

    def __init__(self, loop, skip: int, state: dict) -> None:
        self._loop = loop
        self._iterator = loop.dataloader_iterator
        self._skip = skip
        self._state = state

    def __iter__(self):
        return self

    def __next__(self):
        if self._skip > 0:
            self._skip -= 1
            return next(self._iterator)
        _set_rng_state(self._state)
        self._loop.dataloader_iterator = self._iterator
        return next(self._iterator)

    def __getattr__(self, name):
        return getattr(self._iterator, name)


class _DeferredRemoval:
    """Wraps a file backend; ``remove`` / ``rmtree`` are recorded instead of done."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.pending: List[Tuple[str, str]] = []

    def remove(self, path: str) -> None:
        self.pending.append(('remove', path))

    def rmtree(self, path: str) -> None:
        self.pending.append(('rmtree', path))

    def __getattr__(self, name):
        return getattr(self.backend, name)


@HOOKS.register_module()
class PolaCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` in an order that a kill at any moment cannot break.

    mmengine's hook deletes the oldest checkpoint (``max_keep_ckpts``) and the previous best
    one before it writes the new one, and rewrites ``last_checkpoint`` in place; a run
    killed meanwhile (with ``max_keep_ckpts=1``: whenever it writes a checkpoint) has no
    checkpoint left to resume from. This hook takes the same arguments and

    1. writes the new checkpoint completely under a temporary name in the same folder,
       flushes it to disk and renames it (:meth:`PolaRunner.save_checkpoint`);
    2. then replaces ``last_checkpoint`` the same way, so it names the new file;
    3. only then deletes the checkpoints beyond ``max_keep_ckpts`` and a superseded best
       checkpoint.

    At every moment ``last_checkpoint`` names a complete checkpoint, and ``--resume``
    continues from it. :class:`PolaRunner` uses this class wherever a config asks for
    ``CheckpointHook``, so configs stay unchanged.
    """

    def _save_checkpoint_with_step(self, runner, step, meta) -> None:
        outdated = []
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            # (the deque has maxlen=max_keep_ckpts: make room explicitly, remember what
            # leaves, delete it once the new checkpoint is complete)
            while len(self.keep_ckpt_ids) >= self.max_keep_ckpts:
                outdated.append(self.keep_ckpt_ids.popleft())
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))

        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, ckpt_filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir,
            ckpt_filename,
            self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args)
        if not is_main_process():
            return
        last_ckpt = self.last_ckpt
        atomic_write(
            osp.join(runner.work_dir, 'last_checkpoint'), lambda tmp: _write_text(tmp, last_ckpt))
        self._remove([
            self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(s))
            for s in outdated
        ])

    def _save_best_checkpoint(self, runner, metrics) -> None:
        backend = self.file_backend
        deferred = _DeferredRemoval(backend)
        self.file_backend = deferred
        try:
            super()._save_best_checkpoint(runner, metrics)
        finally:
            self.file_backend = backend
        # what the new best (and the checkpoint saved with it) superseded
        current = {
            getattr(self, 'best_ckpt_path', None), self.last_ckpt,
            *getattr(self, 'best_ckpt_path_dict', {}).values()
        }
        for kind, path in deferred.pending:
            if path not in current:
                getattr(backend, kind)(path)

    def _remove(self, paths: Iterable[str]) -> None:
        for path in paths:
            if path == self.last_ckpt:
                continue
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):  # deepspeed checkpoints are folders
                self.file_backend.rmtree(path)


def _write_text(path: str, text: str) -> None:
    with open(path, 'w') as f:
        f.write(text)


@HOOKS.register_module()
class PolaAttentionBackendHook(Hook):
    """Choose the backend of every Pola attention call from a config:
    ``custom_hooks = [dict(type='PolaAttentionBackendHook', backend='torch')]``.

    Sets :func:`polaformer_mm.ops.set_default_backend` before the run (training, validation
    or test, with any runner) and restores the previous default after it; a run nested in
    another (a hook that validates inside training) leaves the outer run's backend as it
    is. :class:`~.runner.PolaRunner` (``tools/train.py``, ``tools/test.py``) also restores it
    when the run fails; mmengine's ``Runner`` calls no hook then, so after a failed run of
    that runner the default stays this hook's. 'auto' (the default) takes the Triton
    kernels on CUDA where they apply, 'torch' the torch path everywhere, 'triton' the
    kernels or an error naming why not. The environment variable ``POLA_ATTENTION_BACKEND``
    sets the same default for a whole process. One runner takes one such hook: a second is
    an error naming both backends when the run starts, before either sets anything.

    Args:
        backend (str): one of 'auto', 'torch', 'triton'.
    """
    priority = 'VERY_HIGH'

    def __init__(self, backend: str = 'auto') -> None:
        if backend not in BACKENDS:
            raise ValueError(f'PolaAttentionBackendHook: backend={backend!r}; choose one of '
                             f'{", ".join(BACKENDS)}')
        self.backend = backend
        self._previous = None
        self._depth = 0  # runs of this hook under way (validation inside training: 2)

    def before_run(self, runner) -> None:
        """Set the default backend (after checking that it is the runner's only hook of
        this type)."""
        hooks = [h for h in getattr(runner, 'hooks', ()) if isinstance(h, PolaAttentionBackendHook)]
        if len(hooks) > 1:
            backends = ', '.join(f'backend={h.backend!r}' for h in hooks)
            raise ValueError(f'custom_hooks holds {len(hooks)} PolaAttentionBackendHook '
                             f"({backends}): the run would take the last one's backend and "
                             "drop the others'; keep one")
        previous = set_default_backend(self.backend)
        if self._depth == 0:
            self._previous = previous
        self._depth += 1

    def after_run(self, runner) -> None:
        """Restore the default that was set before the (outermost) run."""
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0:
            self.restore()

    def after_failed_run(self, runner) -> None:
        """Restore the default that was set before the run (:class:`~.runner.PolaRunner`
        calls this when a run raises)."""
        self._depth = 0
        self.restore()

    def restore(self) -> None:
        """Put back the default backend that was set before this hook's run, if any."""
        if self._previous is not None:
            set_default_backend(self._previous)
            self._previous = None
