"""mmcv's compiled ops and CUDA: the install-time decision and the run-time check.

mmcv 2.1.0 is built from source. Where torch is a CUDA build, its ops must be compiled
with ``nvcc``; without it the build quietly produces CPU-only ops, and a detector on a
GPU then dies at its first RoIAlign or NMS, long after the job started. So:

* ``tools/build_mmcv_wheel.sh`` asks :func:`plan_mmcv_build` (through ``python
  polaformer_mm/utils/mmcv_ops.py plan``; this file imports nothing of the package, so
  it runs before anything is installed) how to build: CPU ops for a CPU torch; CUDA ops
  for a CUDA torch, with ``TORCH_CUDA_ARCH_LIST`` taken from the visible GPUs when it
  is unset; and where a CUDA torch meets no ``nvcc``, a stop with
  :func:`missing_cuda_ops_message`, unless ``POLA_MMCV_CPU_ONLY=1`` asks for CPU-only ops.
* :func:`check_mmcv_cuda_ops` (called by ``PolaRunner`` once the model is on its device)
  stops a model that is on CUDA and calls mmcv ops when the installed mmcv has no CUDA
  ops, with the same message, before the first iteration.
"""
import os
import re
import subprocess
import sys
import warnings
from typing import Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

CPU_ONLY_ENV = 'POLA_MMCV_CPU_ONLY'
TRUE_VALUES = ('1', 'true', 'yes', 'on')


class MmcvBuildError(RuntimeError):
    """mmcv cannot be built the way this machine's torch needs (the message says why)."""


class MmcvCudaOpsError(RuntimeError):
    """A model on CUDA needs mmcv ops that the installed mmcv lacks."""


class MmcvBuildPlan(NamedTuple):
    """How to build mmcv's ops.

    Args:
        tag: the part of the wheel-cache key that tells builds apart ('cpu',
            'cu128-sm90', 'cu128-cpuops').
        force_cuda: compile the CUDA ops (mmcv's ``FORCE_CUDA=1``).
        cuda_arch_list: ``TORCH_CUDA_ARCH_LIST`` for the build, or None.
        hide_gpus: build with no GPU visible, so that mmcv's setup.py (which compiles
            CUDA ops whenever ``torch.cuda.is_available()``) builds CPU-only ops.
        note: one line for the build log.
    """
    tag: str
    force_cuda: bool
    cuda_arch_list: Optional[str]
    hide_gpus: bool
    note: str


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


def _version_tuple(version: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r'\d+', version)[:2])


def arch_list_from_capabilities(capabilities: Sequence[Tuple[int, int]],
                                max_supported: Optional[Tuple[int, int]] = None) -> str:
    """``TORCH_CUDA_ARCH_LIST`` for the given GPU capabilities, as torch's extension
    builder would choose it: each capability clamped to the newest torch supports, sorted,
    '+PTX' on the last.

    Args:
        capabilities: (major, minor) of each visible GPU.
        max_supported: the newest (major, minor) torch was built for, if known.
    """
    archs = []
    for cap in capabilities:
        cap = tuple(cap)
        if max_supported is not None:
            cap = min(cap, tuple(max_supported))
        arch = f'{cap[0]}.{cap[1]}'
        if arch not in archs:
            archs.append(arch)
    archs.sort(key=lambda a: _version_tuple(a))
    archs[-1] += '+PTX'
    return ';'.join(archs)


def _arch_tag(arch_list: str) -> str:
    """'8.0;9.0+PTX' -> 'sm80_90' (PTX and suffixes dropped: a cache-key part)."""
    nums = [re.sub(r'\D', '', a.split('+')[0]) for a in re.split(r'[;\s]+', arch_list) if a]
    return 'sm' + '_'.join(nums) if nums else 'smnone'


def plan_mmcv_build(torch_cuda: Optional[str],
                    nvcc_version: Optional[str],
                    gpu_capabilities: Sequence[Tuple[int, int]],
                    env: Mapping[str, str],
                    max_supported: Optional[Tuple[int, int]] = None) -> MmcvBuildPlan:
    """Decide how mmcv's ops are built; raises :class:`MmcvBuildError` where they cannot
    be built the way this torch needs.

    Args:
        torch_cuda: ``torch.version.cuda`` (None for a CPU build of torch).
        nvcc_version: version of the ``nvcc`` torch's extension builder would use
            ('12.8'), or None when there is none.
        gpu_capabilities: (major, minor) of each visible GPU.
        env: the environment (``TORCH_CUDA_ARCH_LIST``, ``POLA_MMCV_CPU_ONLY``).
        max_supported: the newest (major, minor) GPU arch torch was built for.
    """
    if not torch_cuda:
        return MmcvBuildPlan('cpu', False, None, False, 'torch is a CPU build: CPU ops')
    cu = 'cu' + torch_cuda.replace('.', '')
    if cpu_only_requested(env):
        return MmcvBuildPlan(
            f'{cu}-cpuops', False, None, bool(gpu_capabilities),
            f'{CPU_ONLY_ENV}=1: CPU-only ops although torch is a CUDA {torch_cuda} build '
            '(mmdet detectors will not run on a GPU)')
    if nvcc_version is None:
        raise MmcvBuildError(
            missing_cuda_ops_message(
                torch_cuda, f'torch is a CUDA {torch_cuda} build but no nvcc was found '
                '(PATH, CUDA_HOME, /usr/local/cuda), so mmcv would be built without its CUDA '
                'ops.'))
    if _version_tuple(nvcc_version)[:1] != _version_tuple(torch_cuda)[:1]:
        raise MmcvBuildError(
            missing_cuda_ops_message(
                torch_cuda, f'nvcc is CUDA {nvcc_version} but torch was built for CUDA '
                f'{torch_cuda}; mmcv\'s CUDA ops cannot be compiled across major versions.'))
    arch_list = env.get('TORCH_CUDA_ARCH_LIST', '').strip()
    if arch_list and arch_list != 'native':
        source = 'TORCH_CUDA_ARCH_LIST'
    elif gpu_capabilities:
        arch_list = arch_list_from_capabilities(gpu_capabilities, max_supported)
        source = 'the visible GPU(s)'
    else:
        raise MmcvBuildError(
            f'torch is a CUDA {torch_cuda} build and nvcc is present, but no GPU is visible '
            'to choose the GPU architectures to compile mmcv\'s CUDA ops for. Fix: set '
            "TORCH_CUDA_ARCH_LIST (e.g. '8.0;8.6;9.0' for A100, RTX 30xx / A6000 and H100) "
            f'or set {CPU_ONLY_ENV}=1 for CPU-only ops.')
    return MmcvBuildPlan(f'{cu}-{_arch_tag(arch_list)}', True, arch_list, False,
                         f'CUDA {torch_cuda} ops for {arch_list} (from {source})')


# ------------------------------------------------------------------- probing this machine
def nvcc_version(cuda_home: Optional[str]) -> Optional[str]:
    """Release of ``CUDA_HOME/bin/nvcc`` ('12.8'), or None when it is not there."""
    if not cuda_home:
        return None
    nvcc = os.path.join(cuda_home, 'bin', 'nvcc')
    if not (os.path.isfile(nvcc) and os.access(nvcc, os.X_OK)):
        return None
    try:
        out = subprocess.run([nvcc, '--version'], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'release (\d+\.\d+)', out)
    return m.group(1) if m else None


def probe_build_environment() -> Dict[str, object]:
    """What :func:`plan_mmcv_build` needs, read from torch and this machine."""
    import torch
    info: Dict[str, object] = dict(
        torch_version=torch.__version__.split('+')[0],
        torch_cuda=torch.version.cuda,
        nvcc_version=None,
        gpu_capabilities=[],
        max_supported=None)
    if not torch.version.cuda:
        return info
    # the nvcc torch's extension builder will use (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)
    from torch.utils.cpp_extension import CUDA_HOME
    info['nvcc_version'] = nvcc_version(CUDA_HOME)
    if torch.cuda.is_available():
        info['gpu_capabilities'] = [
            torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())
        ]
        sms = [
            int(''.join(re.findall(r'\d+',
                                   a.split('_')[1]))) for a in torch.cuda.get_arch_list()
            if a.startswith('sm_')
        ]
        if sms:
            info['max_supported'] = max((s // 10, s % 10) for s in sms)
    return info


def _plan_main() -> int:
    """``python mmcv_ops.py plan``: print 'KEY FORCE_CUDA ARCH_LIST HIDE_GPUS' for
    tools/build_mmcv_wheel.sh (KEY: the wheel-cache key, torch version, Python and
    :attr:`MmcvBuildPlan.tag`; '-' for no arch list), the note to stderr; exit 1 with the
    message on stderr where mmcv cannot be built as this torch needs."""
    info = probe_build_environment()
    try:
        plan = plan_mmcv_build(info['torch_cuda'], info['nvcc_version'], info['gpu_capabilities'],
                               os.environ, info['max_supported'])
    except MmcvBuildError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    print(f'mmcv ops: {plan.note}', file=sys.stderr)
    key = f"torch{info['torch_version']}-cp{sys.version_info[0]}{sys.version_info[1]}-{plan.tag}"
    print(key, int(plan.force_cuda), plan.cuda_arch_list or '-', int(plan.hide_gpus))
    return 0


# --------------------------------------------------------------------------- run time
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
    'CPU_ONLY_ENV', 'MmcvBuildError', 'MmcvCudaOpsError', 'MmcvBuildPlan', 'plan_mmcv_build',
    'arch_list_from_capabilities', 'missing_cuda_ops_message', 'probe_build_environment',
    'mmcv_cuda_ops_version', 'uses_mmcv_ops', 'check_mmcv_cuda_ops'
]

if __name__ == '__main__':
    if sys.argv[1:] != ['plan']:
        sys.exit('usage: python polaformer_mm/utils/mmcv_ops.py plan')
    sys.exit(_plan_main())
