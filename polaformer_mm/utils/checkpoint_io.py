"""Reading and writing checkpoint files safely: the one path every checkpoint takes.

Reading (:func:`load_checkpoint`): the converter, ``init_cfg=dict(type='Pretrained')``
and :class:`~polaformer_mm.engine.PolaRunner` (``load_from``, ``--resume``, test
checkpoints) all read through here.

* Locations are resolved by mmengine's ``CheckpointLoader``: local paths, http(s) URLs
  (downloaded once into torch's hub cache), ``open-mmlab://``, ``torchvision://``,
  ``s3://`` and any scheme registered with ``CheckpointLoader.register_scheme``.
* Every ``torch.load`` that happens meanwhile, including the ones inside mmengine's and
  torch.hub's loaders (torch.hub passes ``weights_only=False``), is weights-only: the
  scope sets torch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` switch, and adds one allowlist
  (:func:`allowed_globals`) to torch's: numpy arrays and scalars, and inert stand-ins
  for ``yacs.config.CfgNode`` (official PolaFormer files), mmengine's ``HistoryBuffer``
  and ``getattr`` (plain mmengine runner checkpoints). The stand-ins construct plain
  data; no code of a checkpoint runs. Both changes last only while the file is read.
* A file that is not a checkpoint (empty, random bytes, cut short, a text file) raises
  :class:`CheckpointError` naming the file; so does one holding objects outside the
  allowlist. Neither message suggests switching weights-only loading off.
* :func:`require_checkpoint` is the one existence check (local paths only).

Writing (:func:`atomic_save`, :func:`replace_file`): the file is written to a temporary
name in the same folder, flushed to disk, then renamed over the target, so a reader (or
a run killed during the write) sees either the old file or the complete new one.

Only torch, numpy and mmengine are imported here (no mmdet / mmseg / mmpretrain).
"""
import contextlib
import os
import os.path as osp
import pickle
import re
import secrets
import zipfile
from collections import OrderedDict
from typing import Any, Callable, Iterator, List, Optional, Union

import numpy as np
import torch
from mmengine.runner.checkpoint import CheckpointLoader, load_from_local

__all__ = [
    'CheckpointError', 'HistoryBufferStandIn', 'allowed_globals', 'atomic_save', 'atomic_write',
    'is_local_checkpoint', 'load_checkpoint', 'replace_file', 'require_checkpoint',
    'safe_load_scope'
]

_FORCE_WEIGHTS_ONLY = 'TORCH_FORCE_WEIGHTS_ONLY_LOAD'
_FORCE_NO_WEIGHTS_ONLY = 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'


class CheckpointError(RuntimeError):
    """A file that cannot be read as a checkpoint, or holds refused objects."""


class _CfgNodeStandIn:
    """Stands in for ``yacs.config.CfgNode`` (official PolaFormer files).

    A pickled CfgNode is rebuilt as ``NEWOBJ(CfgNode)``, ``SETITEMS``, ``BUILD(attrs)``;
    torch's weights-only unpickler applies SETITEMS / BUILD only to plain dicts and
    OrderedDicts, so the node becomes an ``OrderedDict`` (attributes in ``__dict__``).
    No yacs code runs.
    """

    def __new__(cls, *args):
        return OrderedDict()


_CfgNodeStandIn.__module__ = 'yacs.config'
_CfgNodeStandIn.__name__ = _CfgNodeStandIn.__qualname__ = 'CfgNode'


class HistoryBufferStandIn:
    """Takes the place of ``mmengine.logging.history_buffer.HistoryBuffer`` while
    unpickling plain mmengine checkpoints; keeps the pickled state and nothing else
    (``polaformer_mm.engine.runner_state.restore_runner_state`` rebuilds the buffer)."""

    def __setstate__(self, state):
        self.state = dict(state) if isinstance(state, dict) else {}


def _getattr_stand_in(obj, name, *default):
    """Takes the place of ``builtins.getattr`` while unpickling (HistoryBuffer pickles
    its statistics methods as ``getattr(cls, 'mean')``). Returns the name only."""
    return f'<attribute {name}>'


_NUMERIC_DTYPE_CLASSES = tuple(
    type(np.dtype(t)) for t in ('bool', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16',
                                'uint32', 'uint64', 'float16', 'float32', 'float64'))


def allowed_globals() -> list:
    """What weights-only loading accepts beyond torch's own allowlist."""
    return [
        np.dtype,
        np.ndarray,
        *_NUMERIC_DTYPE_CLASSES,
        (np._core.multiarray.scalar, 'numpy._core.multiarray.scalar'),
        (np._core.multiarray._reconstruct, 'numpy._core.multiarray._reconstruct'),
        (np._core.multiarray.scalar, 'numpy.core.multiarray.scalar'),
        (np._core.multiarray._reconstruct, 'numpy.core.multiarray._reconstruct'),
        _CfgNodeStandIn,
        (HistoryBufferStandIn, 'mmengine.logging.history_buffer.HistoryBuffer'),
        (_getattr_stand_in, 'builtins.getattr'),
    ]


@contextlib.contextmanager
def safe_load_scope() -> Iterator[None]:
    """Every ``torch.load`` inside is weights-only with :func:`allowed_globals` added.

    Sets ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` (overrides a caller's
    ``weights_only=False``, e.g. torch.hub's) and unsets
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` for the duration; both are restored on exit.
    """
    saved = {k: os.environ.get(k) for k in (_FORCE_WEIGHTS_ONLY, _FORCE_NO_WEIGHTS_ONLY)}
    os.environ[_FORCE_WEIGHTS_ONLY] = '1'
    os.environ.pop(_FORCE_NO_WEIGHTS_ONLY, None)
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def is_local_checkpoint(path: str) -> bool:
    """True when mmengine's ``CheckpointLoader`` reads ``path`` as a local file."""
    return CheckpointLoader._get_checkpoint_loader(os.fspath(path)) is load_from_local


def require_checkpoint(path: Union[str, os.PathLike], what: str = 'checkpoint') -> str:
    """Raise ``FileNotFoundError`` naming ``what`` when a local checkpoint path is not
    an existing file; URLs and other schemes are left to their loaders.

    Args:
        path (str | PathLike): a local path or anything ``CheckpointLoader`` resolves.
        what (str): how the error names the file, e.g. ``'--resume checkpoint'``.
            Default: ``'checkpoint'``.

    Returns:
        str: ``path`` as a string.
    """
    path = os.fspath(path)
    if not path:
        raise ValueError(f'{what}: empty path')
    if is_local_checkpoint(path):
        local = osp.expanduser(path)
        if osp.isdir(local):
            raise IsADirectoryError(f'{what} is a directory, not a checkpoint file: '
                                    f'{path!r}')
        if not osp.isfile(local):
            raise FileNotFoundError(f'{what} not found: {path!r}')
    return path


_REFUSED_GLOBAL = re.compile(r'GLOBAL (\S+)')
_UNPICKLER_ERROR = re.compile(r'WeightsUnpickler error:\s*([^\n]+)')
_ZIP_MAGIC = b'PK\x03\x04'
_PICKLE_PROTOCOL = b'\x80'


def _sniff_local(path: str, what: str) -> None:
    """Raise :class:`CheckpointError` when the first and last bytes of a local file
    already show that it is no (complete) torch checkpoint."""
    local = osp.expanduser(path)
    if local.endswith('.safetensors'):
        return  # torch.load hands these to safetensors
    size = osp.getsize(local)
    if size == 0:
        raise CheckpointError(f'{what} {path!r} is an empty file (0 bytes), not a checkpoint')
    with open(local, 'rb') as f:
        head = f.read(8)
    if head.startswith(_ZIP_MAGIC):
        if not zipfile.is_zipfile(local):
            raise CheckpointError(
                f'{what} {path!r} is not a complete checkpoint ({size} bytes): the zip '
                'archive torch.save writes ends early or is damaged (an interrupted '
                'write or copy?)')
    elif not head.startswith(_PICKLE_PROTOCOL):
        raise CheckpointError(
            f'{what} {path!r} is not a checkpoint ({size} bytes starting with {head!r}; '
            'torch.save writes a zip archive, older torch a pickle)')


def _read_error(path: str, what: str, err: BaseException) -> CheckpointError:
    """A :class:`CheckpointError` that says what is wrong with ``path`` in words a user
    can act on (torch's own messages suggest disabling weights-only loading)."""
    text = str(err)
    refused = _REFUSED_GLOBAL.search(text) if isinstance(err, pickle.UnpicklingError) \
        else None
    if refused:
        return CheckpointError(
            f'{what} {path!r} holds objects that weights-only loading refuses '
            f'({refused[1]}): only tensors, plain containers and numbers, numpy arrays, '
            'mmengine runner state and yacs configs are read. Re-save the weights '
            '(e.g. torch.save(model.state_dict(), PATH)) where the file was made.')
    detail = _UNPICKLER_ERROR.search(text)
    if detail:
        reason = detail[1].strip()
    elif 'zip archive' in text or 'PytorchStreamReader' in text:
        reason = 'its zip archive is damaged or incomplete'
    else:
        reason = f'{type(err).__name__}: {text.splitlines()[0][:200] if text else ""}'
    return CheckpointError(f'{what} {path!r} is not a (complete) checkpoint: reading it '
                           f'failed ({reason})')


def load_checkpoint(path: Union[str, os.PathLike],
                    map_location: Any = 'cpu',
                    what: str = 'checkpoint',
                    logger: Optional[str] = None) -> Any:
    """Read a checkpoint from anywhere mmengine's ``CheckpointLoader`` reads, weights-only.

    Args:
        path (str | PathLike): local path, http(s) URL or another registered scheme.
        map_location: as for :func:`torch.load`. Default: ``'cpu'``.
        what (str): how errors name the file. Default: ``'checkpoint'``.
        logger (str, optional): mmengine logger name for the loader's message.
            Default: None (mmengine's current logger).

    Returns:
        The unpickled object (usually a dict).

    Raises:
        FileNotFoundError: a local file that does not exist.
        CheckpointError: not a (complete) checkpoint, or objects outside the allowlist.
    """
    path = require_checkpoint(path, what)
    local = is_local_checkpoint(path)
    if local:
        _sniff_local(path, what)
    try:
        with safe_load_scope():
            return CheckpointLoader.load_checkpoint(
                path, map_location=map_location, logger=logger or 'current')
    except (pickle.UnpicklingError, EOFError) as err:
        raise _read_error(path, what, err) from None
    except (FileNotFoundError, PermissionError, MemoryError):
        raise
    except Exception as err:
        # a local file: everything past the checks above happens inside torch.load;
        # elsewhere other errors (network, storage) keep their own message
        if local or re.search(r'PytorchStreamReader|zip archive', str(err)):
            raise _read_error(path, what, err) from None
        raise


def replace_file(tmp_path: str, path: str) -> None:
    """Flush ``tmp_path`` to disk and rename it to ``path`` (same folder), then flush the
    folder entry, so ``path`` is always either the old or the complete new file."""
    with open(tmp_path, 'rb+') as f:
        os.fsync(f.fileno())
    os.replace(tmp_path, path)
    _fsync_dir(osp.dirname(osp.abspath(path)))


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows: folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temporary_path(path: str) -> str:
    """A new, unused temporary file name next to ``path`` (``.NAME.tmp-XXXX``)."""
    folder, name = osp.split(osp.abspath(path))
    while True:
        tmp = osp.join(folder, f'.{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}')
        try:  # the permissions an ordinary open() gives (umask applies)
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def stale_temporaries(path: str) -> List[str]:
    """Temporary files that an interrupted :func:`atomic_save` of ``path`` left."""
    folder, name = osp.split(osp.abspath(path))
    prefix = f'.{name}.tmp-'
    try:
        return [osp.join(folder, n) for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return []


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` for a temporary file next to ``path``, then
    :func:`replace_file` it into place; on any error the temporary file is removed and
    ``path`` is untouched. Leftovers of earlier interrupted writes are removed."""
    for stale in stale_temporaries(path):
        with contextlib.suppress(OSError):
            os.remove(stale)
    tmp = temporary_path(path)
    try:
        write(tmp)
        replace_file(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def atomic_save(obj: Any, path: Union[str, os.PathLike]) -> None:
    """``torch.save(obj, path)``, atomically (:func:`atomic_write`).

    Args:
        obj: what to save.
        path (str | PathLike): a local file path; its folder is created if needed.
    """
    path = os.fspath(path)
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    atomic_write(path, lambda tmp: torch.save(obj, tmp))
