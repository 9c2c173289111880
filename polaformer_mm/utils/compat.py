"""Version shims: every difference between the supported torch, numpy and Triton releases.

The package is written against the oldest API of its range (torch 2.1, numpy 1.24,
Python 3.9); where a newer release offers something the code needs, or changed a name, the
difference is decided here, once, and the rest of the package calls these functions.

* :func:`is_autocast_enabled` -- ``torch.is_autocast_enabled(device_type)`` is torch 2.4+;
  older torch has one function per device type.
* :func:`is_compiling` -- ``torch.compiler.is_compiling`` is torch 2.3+.
* :func:`is_exporting` -- ``torch.compiler.is_exporting`` is torch 2.5+ (False before).
* :data:`TORCHSCRIPT_ONNX_EXPORT` -- the keyword arguments that make ``torch.onnx.export``
  use the TorchScript exporter: ``dynamo=False`` where the function takes ``dynamo``
  (torch 2.5+; torch 2.9+ defaults to the dynamo exporter), none on older torch, whose
  only exporter it is.
* :data:`NATIVE_ALLOWLIST` -- torch 2.6+ takes an allowlist with ``(object, name)`` entries
  in ``torch.serialization.safe_globals``; on older torch
  :mod:`polaformer_mm.utils.checkpoint_io` reads checkpoints with its own restricted
  unpickler instead.
* :func:`has_fused_adamw` -- ``torch.optim.AdamW(fused=True)``: CUDA on every supported
  torch, the CPU from torch 2.4.
* :data:`NUMPY_MULTIARRAY` -- numpy 2 moved ``numpy.core`` to ``numpy._core``.
* :func:`triton_status` -- whether Triton imports, and is one the fused kernels support
  (2.1, the Triton of torch 2.1, and later); :func:`triton_interpreter_reason` -- its
  interpreter (``TRITON_INTERPRET=1``, the kernels on CPU tensors) is Triton 3.0+. The
  differences between Triton releases are decided in
  :mod:`polaformer_mm.ops.pola_attention.triton_compat`, beside the kernels.

Only torch and numpy are imported here (Triton lazily, by :func:`triton_status`).
"""
import contextlib
import functools
import importlib
import inspect
import re
from typing import Iterator, NamedTuple, Optional, Tuple

import numpy as np
import torch

__all__ = [
    'TORCH_VERSION', 'NATIVE_ALLOWLIST', 'native_safe_globals', 'NUMPY_MULTIARRAY', 'MIN_TRITON',
    'TritonStatus', 'TORCHSCRIPT_ONNX_EXPORT', 'has_fused_adamw', 'is_autocast_enabled',
    'is_compiling', 'is_exporting', 'legacy_onnx_export_api', 'triton_status',
    'triton_interpreter_reason', 'version_tuple'
]


def version_tuple(version: str) -> Tuple[int, ...]:
    """'2.1.2+cu121' -> (2, 1, 2); '3.0.0rc1' -> (3, 0, 0); missing parts are left out."""
    return tuple(int(x) for x in re.findall(r'\d+', version.split('+')[0])[:3])


#: The installed torch's (major, minor, patch).
TORCH_VERSION = version_tuple(torch.__version__)

#: Whether ``torch.serialization.safe_globals`` takes ``(object, 'module.name')`` entries
#: (torch 2.6+), which the checkpoint allowlist needs for its stand-ins and numpy aliases.
NATIVE_ALLOWLIST = TORCH_VERSION >= (2, 6) and hasattr(torch.serialization, 'safe_globals')


def native_safe_globals(entries: list):
    """``torch.serialization.safe_globals(entries)`` (torch 2.6+; :data:`NATIVE_ALLOWLIST`).

    Raises:
        RuntimeError: on an older torch, which has no such allowlist for these entries.
    """
    if not NATIVE_ALLOWLIST:
        raise RuntimeError(f'torch {torch.__version__} has no allowlist API with '
                           '(object, name) entries (torch >= 2.6)')
    return torch.serialization.safe_globals(entries)


#: ``numpy._core.multiarray`` on numpy 2, ``numpy.core.multiarray`` on numpy 1.
NUMPY_MULTIARRAY = importlib.import_module(
    'numpy._core.multiarray' if version_tuple(np.__version__) >= (2, ) else 'numpy.core.multiarray')

_DEVICE_AUTOCAST_CHECKS = {
    'cpu': 'is_autocast_cpu_enabled',
    'xpu': 'is_autocast_xpu_enabled',
    'ipu': 'is_autocast_ipu_enabled',
    'xla': 'is_autocast_xla_enabled',
}

if TORCH_VERSION >= (2, 4):

    def is_autocast_enabled(device_type: str) -> bool:
        """Whether autocast is on for ``device_type`` ('cpu', 'cuda', ...)."""
        return torch.is_autocast_enabled(device_type)

else:

    def is_autocast_enabled(device_type: str) -> bool:
        """Whether autocast is on for ``device_type`` ('cpu', 'cuda', ...)."""
        if device_type == 'cuda':
            return torch.is_autocast_enabled()
        check = getattr(torch, _DEVICE_AUTOCAST_CHECKS.get(device_type, ''), None)
        return bool(check()) if check is not None else False


if hasattr(torch, 'compiler') and hasattr(torch.compiler, 'is_compiling'):

    def is_compiling() -> bool:
        """Whether the code runs under ``torch.compile``'s tracing (dynamo)."""
        return torch.compiler.is_compiling()

else:  # torch < 2.3

    def is_compiling() -> bool:
        """Whether the code runs under ``torch.compile``'s tracing (dynamo)."""
        return torch._dynamo.is_compiling()


_is_exporting = getattr(getattr(torch, 'compiler', None), 'is_exporting', None)


def is_exporting() -> bool:
    """Whether ``torch.export`` traces the code (``torch.compiler.is_exporting``, torch
    2.5+); False on older torch, whose ``torch.export`` traces with dynamo, under which
    :func:`is_compiling` holds."""
    return _is_exporting is not None and bool(_is_exporting())


@functools.lru_cache(maxsize=None)
def has_fused_adamw(device_type: str) -> bool:
    """Whether ``torch.optim.AdamW(..., fused=True)`` runs on ``device_type`` ('cpu',
    'cuda', ...) with the installed torch: one kernel per parameter tensor instead of a
    dozen elementwise operations (CUDA on every supported torch, the CPU from torch 2.4).
    Decided by one step on a one-element parameter, not by the version number."""
    if device_type == 'cuda' and not torch.cuda.is_available():
        return False
    try:
        param = torch.zeros(1, device=device_type, requires_grad=True)
        param.grad = torch.ones_like(param)
        torch.optim.AdamW([param], lr=1e-3, fused=True).step()
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


#: Keyword arguments of ``torch.onnx.export`` that select the TorchScript exporter.
TORCHSCRIPT_ONNX_EXPORT = ({
    'dynamo': False
} if 'dynamo' in inspect.signature(torch.onnx.export).parameters else {})


def _cast_long(g, value, non_blocking):
    """The ONNX symbolic of a cast to int64, as ``symbolic_opset9._cast_Long`` wrote it."""
    return g.op('Cast', value, to_i=int(torch.onnx.TensorProtoDataType.INT64))


@contextlib.contextmanager
def legacy_onnx_export_api() -> Iterator[None]:
    """While active, ``torch.onnx`` offers what code written for its torch 1.x / 2.0 API
    calls (mmdeploy 1.3, whose ``torch.onnx.export`` calls pass no ``dynamo=``):

    * ``torch.onnx.export`` takes the TorchScript exporter (``dynamo=False``, unless the
      caller passes ``dynamo``) on torch 2.5+; on older torch it is left as it is;
    * ``torch.onnx.symbolic_opset9._cast_Long``, which newer torch removed, exists (mmdeploy's
      RoIAlign symbolic casts the batch indices with it).

    Both are put back on exit. Nothing is changed where the torch already has them.
    """
    import torch.onnx.symbolic_opset9 as opset9
    original_export = torch.onnx.export
    added_cast = not hasattr(opset9, '_cast_Long')
    if TORCHSCRIPT_ONNX_EXPORT:

        @functools.wraps(original_export)
        def export(*args, **kwargs):
            for key, value in TORCHSCRIPT_ONNX_EXPORT.items():
                kwargs.setdefault(key, value)
            return original_export(*args, **kwargs)

        torch.onnx.export = export
    if added_cast:
        opset9._cast_Long = _cast_long
    try:
        yield
    finally:
        torch.onnx.export = original_export
        if added_cast:
            del opset9._cast_Long


#: Oldest Triton the fused kernels run with (torch 2.1's).
MIN_TRITON = (2, 1)


class TritonStatus(NamedTuple):
    """Whether the fused kernels can use the installed Triton.

    Args:
        usable: Triton imports and is recent enough.
        version: its version string, or None when it does not import.
        reason: why not (one sentence naming both versions), or None.
    """
    usable: bool
    version: Optional[str]
    reason: Optional[str]


_triton_status: Optional[TritonStatus] = None


def triton_status() -> TritonStatus:
    """Import Triton once and say whether the fused kernels support it.

    Any failure of the import counts (a broken install raises more than ImportError).
    """
    global _triton_status
    if _triton_status is None:
        need = '.'.join(map(str, MIN_TRITON))
        try:
            import triton
        except Exception as err:  # noqa: BLE001  (ImportError, or a broken install)
            _triton_status = TritonStatus(
                False, None, f'Triton does not import ({type(err).__name__}: {err}); '
                f'the fused kernels need Triton >= {need}')
        else:
            version = str(getattr(triton, '__version__', '0'))
            if version_tuple(version)[:2] < MIN_TRITON:
                _triton_status = TritonStatus(
                    False, version, f'Triton {version} is installed; the fused kernels '
                    f'need Triton >= {need}')
            else:
                _triton_status = TritonStatus(True, version, None)
    return _triton_status


def triton_interpreter_reason() -> Optional[str]:
    """Why Triton's interpreter (``TRITON_INTERPRET=1``: the kernels on CPU tensors) is
    not at hand, or None: it needs a supported Triton of 3.0 or later (2.x has none)."""
    status = triton_status()
    if not status.usable:
        return status.reason
    if version_tuple(status.version)[:1] < (3, ):
        return (f'Triton {status.version} has no interpreter '
                '(TRITON_INTERPRET=1 needs Triton >= 3.0)')
    return None
