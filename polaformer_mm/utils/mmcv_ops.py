"""mmcv's compiled ops and CUDA: the run-time check, and the message it shares with the
install-time decision.

mmcv 2.1.0 is built from source. Where torch is a CUDA build, its ops must be compiled
with ``nvcc``; without it the build quietly produces CPU-only ops, and a detector on a
GPU then dies at its first RoIAlign or NMS, long after the job started. So:

* ``.dev_scripts/build_mmcv_wheel.sh`` asks ``.dev_scripts/mmcv_build_plan.py`` how to
  build: CPU ops for a CPU torch; CUDA ops for a CUDA torch, with
  ``TORCH_CUDA_ARCH_LIST`` taken from the visible GPUs when it is unset; and where a CUDA
  torch meets no ``nvcc``, a stop with :func:`missing_cuda_ops_message`, unless
  ``POLA_MMCV_CPU_ONLY=1`` asks for CPU-only ops. That script runs before anything is
  installed and loads this file by its path, so this file imports nothing of the package
  (nor anything beyond the standard library at import time).
* :func:`check_mmcv_cuda_ops` (called by ``PolaRunner`` once the model is on its device)
  stops a model that is on CUDA and calls mmcv ops when the installed mmcv has no CUDA
  ops, with the same message, before the first iteration.
"""
import os
import warnings
from typing import Mapping, Optional, Tuple

CPU_ONLY_ENV = 'POLA_MMCV_CPU_ONLY'
TRUE_VALUES = ('1', 'true', 'yes', 'on')


class MmcvCudaOpsError(RuntimeError):
    """A model on CUDA needs mmcv ops that the installed mmcv lacks."""


def cpu_only_requested(env: Mapping[str, str]) -> bool:
    """Whether ``env`` opts in to CPU-only mmcv ops (``POLA_MMCV_CPU_ONLY``)."""
    return env.get(CPU_ONLY_ENV, '').strip().lower() in TRUE_VALUES


def missing_cuda_ops_message(torch_cuda: Optional[str], what: str) -> str:
    """The one message for a CUDA torch without mmcv CUDA ops, at install and at run time.

    Args:
        torch_cuda: the CUDA version torch was built for ('12.8'), if known.
        what: the first sentence: what is wrong on this machine.
    """
    toolkit = f'CUDA toolkit {torch_cuda}' if torch_cuda else \
        'CUDA toolkit of the version torch was built for (torch.version.cuda)'
    return (f'{what} Fix: install the {toolkit} (nvcc on PATH, or CUDA_HOME pointing at it) '
            'and rebuild mmcv with its CUDA ops (`make clean-venv install`; the mmcv wheel '
            f'cache is keyed by CUDA version and GPU arch), or set {CPU_ONLY_ENV}=1 to '
            'knowingly use CPU-only mmcv ops (mmdet detectors then cannot run on a GPU).')


def mmcv_cuda_ops_version() -> Tuple[bool, Optional[str], Optional[str]]:
    """(compiled ops importable, CUDA version they were compiled with or None, error)."""
    try:
        import importlib
        ext = importlib.import_module('mmcv._ext')
        version = ext.get_compiling_cuda_version()
    except Exception as e:  # noqa: BLE001  (absent mmcv, no compiled ops, broken build)
        return False, None, f'{type(e).__name__}: {e}'
    return True, (None if version == 'not available' else str(version)), None


def uses_mmcv_ops(model) -> bool:
    """Whether ``model`` calls mmcv's compiled ops: it holds an ``mmcv.ops`` module
    (RoIAlign, DeformConv, ...) or is an mmdet model (whose post-processing calls
    ``mmcv.ops.batched_nms``)."""
    if type(model).__module__.startswith('mmdet.'):
        return True
    return any(type(m).__module__.startswith('mmcv.ops') for m in model.modules())


def _on_cuda(model) -> bool:
    return any(p.is_cuda for p in model.parameters()) or \
        any(b.is_cuda for b in model.buffers())


def check_mmcv_cuda_ops(model,
                        env: Optional[Mapping[str, str]] = None,
                        status: Optional[Tuple[bool, Optional[str], Optional[str]]] = None,
                        on_cuda: Optional[bool] = None) -> None:
    """Stop (``MmcvCudaOpsError``) when ``model`` is on CUDA and calls mmcv ops that the
    installed mmcv has no CUDA build of; with ``POLA_MMCV_CPU_ONLY=1`` warn instead.

    Args:
        model: the model as the runner holds it (wrappers are looked through).
        env: environment to read ``POLA_MMCV_CPU_ONLY`` from (default ``os.environ``).
        status: :func:`mmcv_cuda_ops_version`'s answer (default: asked now).
        on_cuda: whether the model runs on CUDA (default: whether a parameter or
            buffer of it is on a CUDA device).
    """
    inner = getattr(model, 'module', model)
    if on_cuda is None:
        on_cuda = _on_cuda(inner)
    if not on_cuda or not uses_mmcv_ops(inner):
        return
    ops, cuda, error = status if status is not None else mmcv_cuda_ops_version()
    if ops and cuda:
        return
    import torch
    what = (f'The model ({type(inner).__name__}) is on CUDA and calls mmcv ops, but ' +
            (f'mmcv\'s compiled ops do not load ({error}).'
             if not ops else 'the installed mmcv was built without CUDA ops (CPU-only).'))
    message = missing_cuda_ops_message(torch.version.cuda, what)
    if ops and cpu_only_requested(os.environ if env is None else env):
        warnings.warn(message, RuntimeWarning)
        return
    raise MmcvCudaOpsError(message)


__all__ = [
    'CPU_ONLY_ENV', 'MmcvCudaOpsError', 'cpu_only_requested', 'missing_cuda_ops_message',
    'mmcv_cuda_ops_version', 'uses_mmcv_ops', 'check_mmcv_cuda_ops'
]
