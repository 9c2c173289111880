"""Runner state that weights-only loading can read, and back.

mmengine's Runner saves the message hub (``HistoryBuffer`` objects, numpy arrays and
scalars) inside every checkpoint; torch's weights-only loading refuses those objects.
Instead of switching the safety off, the project

* saves checkpoints whose every object is weights-only loadable: history buffers become
  plain dicts of tensors, numpy scalars become Python numbers, arrays become tensors
  (:func:`to_weights_only_safe`, applied by ``ResumableStateHook``); and
* reads checkpoints through :func:`polaformer_mm.utils.checkpoint_io.load_checkpoint`,
  whose allowlist also reads plain mmengine checkpoints (history buffers come back as
  inert stand-ins); :func:`restore_runner_state` turns both encodings back into real
  ``HistoryBuffer`` objects so the message hub resumes.
"""
from collections import Counter, OrderedDict

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

from ..utils.checkpoint_io import HistoryBufferStandIn

_BUFFER_TAG = '__polaformer_mm_history_buffer__'


def _encode_buffer(buf: HistoryBuffer) -> dict:
    log, count = buf.data
    return {
        _BUFFER_TAG: 1,
        'log_history': torch.from_numpy(np.asarray(log, dtype=np.float64).copy()),
        'count_history': torch.from_numpy(np.asarray(count, dtype=np.int64).copy()),
        'max_length': int(buf.max_length),
    }


def to_weights_only_safe(obj):
    """Return ``obj`` with history buffers, numpy scalars and arrays replaced by
    weights-only loadable equivalents (containers keep their types, but a
    ``collections.Counter``, e.g. a multi-step scheduler's ``milestones``, which torch <
    2.6's weights-only loading refuses, becomes a plain dict:
    :func:`restore_scheduler_state` turns it back)."""
    if isinstance(obj, HistoryBuffer):
        return _encode_buffer(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            return [to_weights_only_safe(v) for v in obj.tolist()]
        return torch.from_numpy(obj.copy())
    if isinstance(obj, OrderedDict):
        return OrderedDict((k, to_weights_only_safe(v)) for k, v in obj.items())
    if isinstance(obj, dict):
        return {k: to_weights_only_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_weights_only_safe(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, '_fields'):
        return tuple(to_weights_only_safe(v) for v in obj)
    return obj


def _decode_buffer(state: dict) -> HistoryBuffer:
    if _BUFFER_TAG in state:
        log, count, max_length = (state['log_history'], state['count_history'], state['max_length'])
    else:  # the state of a pickled HistoryBuffer (private attribute names)
        log, count = state.get('_log_history', []), state.get('_count_history', [])
        max_length = state.get('_max_length', 1000000)
    log = log.numpy() if torch.is_tensor(log) else np.asarray(log)
    count = count.numpy() if torch.is_tensor(count) else np.asarray(count)
    return HistoryBuffer(list(log), list(count), int(max_length))


def restore_scheduler_state(states):
    """Give the ``milestones`` of saved parameter-scheduler states (a list of dicts, or
    lists of them per optimizer) back their type, ``collections.Counter``
    (:func:`to_weights_only_safe` saved them as plain dicts); in place."""
    if isinstance(states, dict):
        for name, state in states.items():  # one list per optimizer
            states[name] = restore_scheduler_state(state)
        return states
    for state in states if isinstance(states, list) else []:
        if isinstance(state, dict) and isinstance(state.get('milestones'), dict) and \
                not isinstance(state['milestones'], Counter):
            state['milestones'] = Counter(state['milestones'])
    return states


def restore_runner_state(obj):
    """Inverse of :func:`to_weights_only_safe` for what the message hub needs: rebuild
    ``HistoryBuffer`` objects from either encoding, in place where possible."""
    if isinstance(obj, HistoryBufferStandIn):
        return _decode_buffer(obj.state)
    if isinstance(obj, dict):
        if _BUFFER_TAG in obj:
            return _decode_buffer(obj)
        for k in list(obj):
            obj[k] = restore_runner_state(obj[k])
        return obj
    if isinstance(obj, list):
        return [restore_runner_state(v) for v in obj]
    return obj
