"""Reading and writing checkpoint files safely: the one path every checkpoint takes.

Reading (:func:`load_checkpoint`): the converter, ``init_cfg=dict(type='Pretrained')``
and :class:`~polaformer_mm.engine.PolaRunner` (``load_from``, ``--resume``, test
checkpoints) all read through here.

* Locations are resolved by mmengine's ``CheckpointLoader``: local paths, http(s) URLs
  (downloaded once into torch's hub cache), ``open-mmlab://``, ``torchvision://``,
  ``s3://`` and any scheme registered with ``CheckpointLoader.register_scheme``.
* Every ``torch.load`` that happens meanwhile, including the ones inside mmengine's and
  torch.hub's loaders (torch.hub passes ``weights_only=False``), is weights-only, with one
  allowlist (:func:`allowed_globals`) on top of torch's: numpy arrays and scalars, and
  inert stand-ins for ``yacs.config.CfgNode`` (official PolaFormer files), mmengine's
  ``HistoryBuffer`` and ``getattr`` (plain mmengine runner checkpoints). The stand-ins
  construct plain data; no code of a checkpoint runs. On torch 2.6+ the scope sets torch's
  ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` switch and adds the allowlist through
  ``torch.serialization.safe_globals``; older torch (2.1-2.5) has no allowlist API for
  these entries, so there ``torch.load`` reads with :class:`RestrictedUnpickler`, which
  resolves only the globals of :func:`restricted_allowlist` (what torch's own weights-only
  unpickler accepts, plus the same additions) and refuses every other. Both changes last
  only while the file is read.
* A file that is not a checkpoint (empty, random bytes, cut short, a text file) raises
  :class:`CheckpointError` naming the file; so does one holding objects outside the
  allowlist, and one that is intact but that the installed torch cannot read (saved by a
  newer torch, say), each with its own message. None suggests switching weights-only
  loading off.
* :func:`require_checkpoint` is the one existence check (local paths only).
* :func:`strip_ddp_prefix` drops the ``module.`` that a state dict saved from a
  ``DistributedDataParallel`` wrapper puts before every key, as mmengine's loader does
  (``revise_keys``); every reader of weights in this project applies it.

Writing (:func:`atomic_save`, :func:`replace_file`): the file is written to a temporary
name in the same folder, flushed to disk, then renamed over the target, so a reader (or
a run killed during the write) sees either the old file or the complete new one. The
temporary name carries the writer's process id (``.NAME.tmp-PID-XXXXXXXX``); a later write
removes another writer's temporary file only when that process is dead on this host
(:func:`stale_temporaries`), never one that is still being written.

Only torch, numpy and mmengine are imported here (no mmdet / mmseg / mmpretrain).
"""
import _compat_pickle
import contextlib
import os
import os.path as osp
import pickle
import re
import secrets
import types
import zipfile
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

import numpy as np
import torch
from mmengine.runner.checkpoint import CheckpointLoader, load_from_local

from .compat import NATIVE_ALLOWLIST, NUMPY_MULTIARRAY, native_safe_globals

__all__ = [
    'CheckpointError', 'DDP_PREFIX', 'HistoryBufferStandIn', 'RestrictedUnpickler',
    'allowed_globals', 'atomic_save', 'atomic_write', 'is_local_checkpoint', 'load_checkpoint',
    'process_alive', 'replace_file', 'require_checkpoint', 'restricted_allowlist',
    'restricted_load', 'safe_load_scope', 'stale_temporaries', 'temporary_path'
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
        # files written under numpy 2 name numpy._core, under numpy 1 numpy.core
        (NUMPY_MULTIARRAY.scalar, 'numpy._core.multiarray.scalar'),
        (NUMPY_MULTIARRAY._reconstruct, 'numpy._core.multiarray._reconstruct'),
        (NUMPY_MULTIARRAY.scalar, 'numpy.core.multiarray.scalar'),
        (NUMPY_MULTIARRAY._reconstruct, 'numpy.core.multiarray._reconstruct'),
        _CfgNodeStandIn,
        (HistoryBufferStandIn, 'mmengine.logging.history_buffer.HistoryBuffer'),
        (_getattr_stand_in, 'builtins.getattr'),
    ]


def _qualified_name(obj) -> str:
    return f'{obj.__module__}.{obj.__qualname__}'


# What torch's own weights-only unpickler accepts (torch 2.1-2.13 alike), by the names a
# pickle stores; entries a torch does not have are left out.
_TORCH_REBUILD_FUNCTIONS = ('_rebuild_parameter', '_rebuild_parameter_with_state',
                            '_rebuild_tensor', '_rebuild_tensor_v2', '_rebuild_tensor_v3',
                            '_rebuild_sparse_tensor', '_rebuild_meta_tensor_no_storage',
                            '_rebuild_nested_tensor')


def _torch_weights_globals() -> Dict[str, Any]:
    rc: Dict[str, Any] = {
        'collections.OrderedDict': OrderedDict,
        'collections.Counter': __import__('collections').Counter,
        'torch.nn.parameter.Parameter': torch.nn.Parameter,
        'torch.serialization._get_layout': torch.serialization._get_layout,
        'torch.Size': torch.Size,
        'torch.Tensor': torch.Tensor,
        'torch.device': torch.device,
        'torch._tensor._rebuild_from_type_v2': torch._tensor._rebuild_from_type_v2,
        'builtins.set': set,
        'builtins.frozenset': frozenset,
        'builtins.bytearray': bytearray,
        'builtins.complex': complex,
        '_codecs.encode': __import__('_codecs').encode,  # how protocol 2 pickles bytes
    }
    for value in vars(torch).values():
        if isinstance(value, torch.dtype):
            rc[str(value)] = value
    for cls in (*torch._tensor_classes, *torch._storage_classes):
        rc[f'{cls.__module__}.{cls.__name__}'] = cls
    for name in _TORCH_REBUILD_FUNCTIONS:
        if hasattr(torch._utils, name):
            rc[f'torch._utils.{name}'] = getattr(torch._utils, name)
    return rc


def restricted_allowlist() -> Dict[str, Any]:
    """Every global :class:`RestrictedUnpickler` resolves, by the name a pickle stores:
    torch's weights-only allowlist and :func:`allowed_globals`."""
    rc = _torch_weights_globals()
    for entry in allowed_globals():
        obj, name = entry if isinstance(entry, tuple) else (entry, _qualified_name(entry))
        rc[name] = obj
    return rc


class RestrictedUnpickler(pickle.Unpickler):
    """A pickle reader that resolves only the globals of :func:`restricted_allowlist` and
    refuses every other before anything is called: what ``torch.load`` reads with on a
    torch without an allowlist API for :func:`allowed_globals` (2.1-2.5).

    Objects are built only by calling allowlisted constructors and rebuild functions;
    a ``__reduce__`` payload naming any other callable (``os.system``, ``eval``, ...) stops
    the read with ``pickle.UnpicklingError`` naming it.
    """

    _allowed: Optional[Dict[str, Any]] = None

    def find_class(self, module: str, name: str) -> Any:
        """The allowlisted object named ``module.name``; anything else is refused."""
        if RestrictedUnpickler._allowed is None:
            RestrictedUnpickler._allowed = restricted_allowlist()
        # protocol 2 names Python 2's modules (__builtin__.set), as pickle's own
        # find_class maps them
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        key = f'{module}.{name}'
        try:
            return RestrictedUnpickler._allowed[key]
        except KeyError:
            raise pickle.UnpicklingError(
                f'Weights-only unpickler error: Unsupported global: GLOBAL {key} is not '
                'an allowed global') from None


def _restricted_load(file, **kwargs):
    return RestrictedUnpickler(file, **kwargs).load()


#: The ``pickle_module`` handed to ``torch.load`` on torch 2.1-2.5.
_RESTRICTED_PICKLE = types.ModuleType('polaformer_mm_restricted_pickle')
_RESTRICTED_PICKLE.Unpickler = RestrictedUnpickler
_RESTRICTED_PICKLE.load = _restricted_load
_RESTRICTED_PICKLE.UnpicklingError = pickle.UnpicklingError


def restricted_load(f: Any, map_location: Any = 'cpu', **kwargs) -> Any:
    """``torch.load`` with :class:`RestrictedUnpickler`, on any torch: what
    :func:`safe_load_scope` reads with where torch has no allowlist API for
    :func:`allowed_globals` (2.1-2.5).

    Args:
        f: a path or a file object, as for :func:`torch.load`.
        map_location: as for :func:`torch.load`. Default: ``'cpu'``.
        **kwargs: further arguments of :func:`torch.load` (``mmap``); ``weights_only``
            and ``pickle_module`` are ignored.
    """
    kwargs.pop('weights_only', None)
    kwargs.pop('pickle_module', None)
    return _TORCH_LOAD(
        f,
        map_location=map_location,
        pickle_module=_RESTRICTED_PICKLE,
        weights_only=False,
        **kwargs)


#: torch.load as torch defines it (the scope below swaps the attribute on old torch).
_TORCH_LOAD = torch.load


def _restricted_torch_load(original: Callable) -> Callable:
    """``torch.load`` that always reads with :class:`RestrictedUnpickler`, whatever the
    caller passes for ``weights_only`` or ``pickle_module``."""

    def load(f, map_location=None, pickle_module=None, *, weights_only=None, **kwargs):
        return original(
            f,
            map_location=map_location,
            pickle_module=_RESTRICTED_PICKLE,
            weights_only=False,
            **kwargs)

    load.__doc__ = original.__doc__
    return load


@contextlib.contextmanager
def safe_load_scope() -> Iterator[None]:
    """Every ``torch.load`` inside is weights-only with :func:`allowed_globals` added.

    On torch 2.6+ sets ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` (overrides a caller's
    ``weights_only=False``, e.g. torch.hub's) and adds the allowlist with
    ``torch.serialization.safe_globals``. On older torch ``torch.load`` itself reads with
    :class:`RestrictedUnpickler` for the duration (both switches unset: the forced switch
    would hand the file to torch's own, narrower unpickler). ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``
    is unset either way. Everything is restored on exit.
    """
    saved = {k: os.environ.get(k) for k in (_FORCE_WEIGHTS_ONLY, _FORCE_NO_WEIGHTS_ONLY)}
    os.environ.pop(_FORCE_NO_WEIGHTS_ONLY, None)
    original_load = torch.load
    try:
        if NATIVE_ALLOWLIST:
            os.environ[_FORCE_WEIGHTS_ONLY] = '1'
            with native_safe_globals(allowed_globals()):
                yield
        else:
            os.environ.pop(_FORCE_WEIGHTS_ONLY, None)
            torch.load = _restricted_torch_load(original_load)
            yield
    finally:
        torch.load = original_load
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


def _intact_archive(path: Optional[str]) -> bool:
    """Whether ``path`` is a local zip archive of torch.save whose every member reads
    back with a good checksum and whose pickle is complete: a file that is not damaged."""
    if path is None:
        return False
    local = osp.expanduser(path)
    try:
        with zipfile.ZipFile(local) as archive:
            if archive.testzip() is not None:
                return False
            pickles = [n for n in archive.namelist() if n.endswith('/data.pkl')]
            return len(pickles) == 1 and archive.read(pickles[0]).endswith(b'.')
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def _unreadable_here(path: str, what: str, reason: str) -> CheckpointError:
    return CheckpointError(
        f'{what} {path!r} is an intact checkpoint that this torch ({torch.__version__}) '
        f'cannot read ({reason}); it was probably saved by a newer torch. Read it with '
        'that torch and re-save the weights (torch.save(state_dict, PATH)), or upgrade '
        'torch.')


def _read_error(path: str,
                what: str,
                err: BaseException,
                local: Optional[str] = None) -> CheckpointError:
    """A :class:`CheckpointError` that says what is wrong with ``path`` in words a user
    can act on (torch's own messages suggest disabling weights-only loading): damaged,
    holding refused objects, or intact but unreadable by the installed torch."""
    text = str(err)
    refused = _REFUSED_GLOBAL.search(text) if isinstance(err, pickle.UnpicklingError) \
        else None
    if refused and refused[1].startswith('torch.') and \
            not _torch_has(refused[1][len('torch.'):]):
        return _unreadable_here(path, what, f'it holds {refused[1]}, which this torch lacks')
    if refused:
        return CheckpointError(
            f'{what} {path!r} holds objects that weights-only loading refuses '
            f'({refused[1]}): only tensors, plain containers and numbers, numpy arrays, '
            'mmengine runner state and yacs configs are read. Re-save the weights '
            '(e.g. torch.save(model.state_dict(), PATH)) where the file was made.')
    detail = _UNPICKLER_ERROR.search(text)
    if not refused and _intact_archive(local):
        first = text.splitlines()[0][:200] if text else ''
        return _unreadable_here(path, what, f'{type(err).__name__}: {first}')
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
        raise _read_error(path, what, err, path if local else None) from None
    except (FileNotFoundError, PermissionError, MemoryError):
        raise
    except Exception as err:
        # a local file: everything past the checks above happens inside torch.load;
        # elsewhere other errors (network, storage) keep their own message
        if local or re.search(r'PytorchStreamReader|zip archive', str(err)):
            raise _read_error(path, what, err, path if local else None) from None
        raise


#: What mmengine's ``_load_checkpoint_to_model`` strips by default (``revise_keys``).
DDP_PREFIX = 'module.'


def strip_ddp_prefix(state_dict: Dict[str, Any]) -> 'OrderedDict[str, Any]':
    """``state_dict`` with a leading ``module.`` (what ``DistributedDataParallel`` and
    ``DataParallel`` put before their model's keys) removed from every key, as mmengine's
    loader does; other keys are kept as they are."""
    n = len(DDP_PREFIX)
    return OrderedDict((k[n:] if isinstance(k, str) and k.startswith(DDP_PREFIX) else k, v)
                       for k, v in state_dict.items())


def _torch_has(dotted: str) -> bool:
    obj = torch
    for part in dotted.split('.'):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


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


def process_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists on this host (a zombie counts as alive;
    so does any pid where that cannot be told, e.g. on Windows)."""
    if pid <= 0 or os.name == 'nt':  # os.kill(pid, 0) would end the process there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, under another user
        return True
    return True


def temporary_path(path: str) -> str:
    """A new, unused temporary file name next to ``path``
    (``.NAME.tmp-PID-XXXXXXXX``: this process's id and 8 random hex digits)."""
    folder, name = osp.split(osp.abspath(path))
    while True:
        tmp = osp.join(folder, f'.{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}')
        try:  # the permissions an ordinary open() gives (umask applies)
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


_TEMPORARY_SUFFIX = re.compile(r'(\d+)-[0-9a-f]+')


def stale_temporaries(path: str) -> List[str]:
    """Temporary files of ``path`` that an interrupted :func:`atomic_write` left: those
    whose writer (the pid in the name) is dead on this host. Temporary files of live
    processes, this one included, and names that carry no pid are not listed."""
    folder, name = osp.split(osp.abspath(path))
    prefix = f'.{name}.tmp-'
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    stale = []
    for n in names:
        match = _TEMPORARY_SUFFIX.fullmatch(n[len(prefix):]) if n.startswith(prefix) else None
        if match and not process_alive(int(match[1])):
            stale.append(osp.join(folder, n))
    return stale


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` for a temporary file next to ``path``, then
    :func:`replace_file` it into place; on any error the temporary file is removed and
    ``path`` is untouched. Leftovers of earlier interrupted writes are removed when their
    writer is dead (:func:`stale_temporaries`)."""
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
