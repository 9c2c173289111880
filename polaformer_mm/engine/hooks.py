"""Hooks the project's runner installs."""
import random

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from .checkpoint_io import to_weights_only_safe


def _rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = dict(
        python=random.getstate(),
        numpy=dict(kind=kind, keys=torch.from_numpy(keys.astype(np.int64)), pos=int(pos),
                   has_gauss=int(has_gauss), cached_gaussian=float(cached)),
        torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state['python'])
    n = state['numpy']
    np.random.set_state((n['kind'], n['keys'].numpy().astype(np.uint32), n['pos'],
                         n['has_gauss'], n['cached_gaussian']))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


@HOOKS.register_module()
class ResumableStateHook(Hook):
    """Makes checkpoints weights-only loadable and resumable to the same random state.

    Before a checkpoint is written, it stores the Python, numpy, torch (and CUDA) random
    states under ``checkpoint['rng_states']`` (of every rank when an epoch-based
    distributed run saves at an epoch end) and converts the message hub and meta to
    weights-only loadable data. When the runner
    resumes from such a checkpoint, the states are put back at the start of the next
    training epoch. An epoch-based run interrupted after an epoch then continues
    exactly as the uninterrupted run would have (data order, augmentations, dropout).
    Iteration-based loops re-read the skipped batches on resume, which draws from the
    random generators, so there the resumed augmentations differ from the
    uninterrupted run's (the data order does not).
    """

    # before CheckpointHook (VERY_LOW) in after_train_epoch; after the hooks that add
    # to a checkpoint (NORMAL) in before_save_checkpoint
    priority = 'LOW'

    def __init__(self) -> None:
        self._pending = None
        self._gathered = None

    def after_train_epoch(self, runner) -> None:
        # Runner.save_checkpoint runs on rank 0 only, so the ranks' states are collected
        # here, where every rank passes, just before CheckpointHook saves
        if get_world_size() > 1:
            self._gathered = (runner.epoch, all_gather_object(_rng_state()))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if get_world_size() == 1:
            checkpoint['rng_states'] = [_rng_state()]
        elif self._gathered is not None and self._gathered[0] == runner.epoch:
            checkpoint['rng_states'] = self._gathered[1]
        self._gathered = None
        for key in ('meta', 'message_hub'):
            if key in checkpoint:
                checkpoint[key] = to_weights_only_safe(checkpoint[key])

    def set_pending(self, checkpoint: dict) -> bool:
        """Remember the random states of ``checkpoint`` for the next epoch start; False
        when it holds none for this number of processes."""
        states = checkpoint.get('rng_states')
        ok = bool(states) and len(states) == get_world_size()
        self._pending = states[get_rank()] if ok else None
        return ok

    def before_train_epoch(self, runner) -> None:
        if self._pending is not None:
            _set_rng_state(self._pending)
            self._pending = None
