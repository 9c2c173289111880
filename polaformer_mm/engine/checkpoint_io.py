"""Checkpoints of training runs under torch's weights-only loading.

mmengine's Runner saves the message hub (``HistoryBuffer`` objects, numpy arrays and
scalars) inside every checkpoint. Since torch 2.6 ``torch.load`` defaults to
``weights_only=True`` and refuses those objects, so mmengine 0.10's ``resume`` fails.
Instead of switching the safety off, the project

* saves checkpoints whose every object is weights-only loadable: history buffers become
  plain dicts of tensors, numpy scalars become Python numbers, arrays become tensors
  (:func:`to_weights_only_safe`); and
* reads checkpoints with ``weights_only=True`` plus a scoped allowlist of numpy data
  types and two inert stand-ins for what plain mmengine checkpoints carry: a
  ``HistoryBuffer`` stand-in that only keeps its state, and a ``getattr`` stand-in that
  returns a name instead of looking anything up (:func:`runner_checkpoint_globals`).
  :func:`restore_runner_state` turns both encodings back into real ``HistoryBuffer``
  objects so the message hub resumes.

Nothing is executed from a checkpoint beyond constructing those data types.
"""
from collections import OrderedDict

import os.path as osp

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

_BUFFER_TAG = '__polaformer_mm_history_buffer__'
_NUMERIC_DTYPE_CLASSES = tuple(
    type(np.dtype(t)) for t in ('bool', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16',
                                'uint32', 'uint64', 'float16', 'float32', 'float64'))


class _HistoryBufferStandIn:
    """Takes the place of ``mmengine.logging.history_buffer.HistoryBuffer`` while
    unpickling; keeps the pickled state and nothing else."""

    def __setstate__(self, state):
        self.state = dict(state) if isinstance(state, dict) else {}


def _getattr_stand_in(obj, name, *default):
    """Takes the place of ``builtins.getattr`` while unpickling (HistoryBuffer pickles
    its statistics methods as ``getattr(cls, 'mean')``). Returns the name only."""
    return f'<attribute {name}>'


def runner_checkpoint_globals():
    """Context manager: the allowlist for reading mmengine-made checkpoints."""
    allowed = [
        np.dtype, np.ndarray, *_NUMERIC_DTYPE_CLASSES,
        (np._core.multiarray.scalar, 'numpy._core.multiarray.scalar'),
        (np._core.multiarray._reconstruct, 'numpy._core.multiarray._reconstruct'),
        (np._core.multiarray.scalar, 'numpy.core.multiarray.scalar'),
        (np._core.multiarray._reconstruct, 'numpy.core.multiarray._reconstruct'),
        (_HistoryBufferStandIn, 'mmengine.logging.history_buffer.HistoryBuffer'),
        (_getattr_stand_in, 'builtins.getattr'),
    ]
    return torch.serialization.safe_globals(allowed)


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
    weights-only loadable equivalents (containers keep their types)."""
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
        log, count, max_length = (state['log_history'], state['count_history'],
                                  state['max_length'])
    else:  # the state of a pickled HistoryBuffer (private attribute names)
        log, count = state.get('_log_history', []), state.get('_count_history', [])
        max_length = state.get('_max_length', 1000000)
    log = log.numpy() if torch.is_tensor(log) else np.asarray(log)
    count = count.numpy() if torch.is_tensor(count) else np.asarray(count)
    return HistoryBuffer(list(log), list(count), int(max_length))


def restore_runner_state(obj):
    """Inverse of :func:`to_weights_only_safe` for what the message hub needs: rebuild
    ``HistoryBuffer`` objects from either encoding, in place where possible."""
    if isinstance(obj, _HistoryBufferStandIn):
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


def require_checkpoint(path: str, what: str = 'checkpoint') -> None:
    """Raise FileNotFoundError naming ``what`` when a local checkpoint path is missing
    (URLs are left to mmengine's loaders)."""
    if '://' not in path and not osp.isfile(path):
        raise FileNotFoundError(f'{what} not found: {path!r}')
