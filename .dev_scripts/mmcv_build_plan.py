#!/usr/bin/env python
"""How to build mmcv's compiled ops for the torch at hand, for
.dev_scripts/build_mmcv_wheel.sh (``make install`` runs it; a maintainer's script, not a
user tool).

    python .dev_scripts/mmcv_build_plan.py

prints ``KEY FORCE_CUDA ARCH_LIST HIDE_GPUS`` (KEY: the wheel-cache key, made of the torch
version, the Python version and :attr:`MmcvBuildPlan.tag`; ``-`` for no arch list) and a
note for the build log on stderr: CPU ops for a CPU torch; CUDA ops for a CUDA torch, with
``TORCH_CUDA_ARCH_LIST`` taken from the visible GPUs when it is unset. Where a CUDA torch
meets no ``nvcc`` (or one of another major version) it exits 1 with the fix on stderr,
unless ``POLA_MMCV_CPU_ONLY=1`` asks for CPU-only ops.

It runs before mmcv (or this package) is installed: it imports nothing of the package
but ``polaformer_mm/utils/mmcv_ops.py`` by its path (the message it shares with the
run-time check), which needs only the standard library.
"""
import importlib.util
import os
import os.path as osp
import re
import subprocess
import sys
from typing import Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

_MMCV_OPS = osp.join(
    osp.dirname(osp.dirname(osp.abspath(__file__))), 'polaformer_mm', 'utils', 'mmcv_ops.py')


def _load_mmcv_ops():
    """``polaformer_mm/utils/mmcv_ops.py`` loaded by its path (the package may not import
    yet: mmcv is what is being built)."""
    spec = importlib.util.spec_from_file_location('_pola_mmcv_ops', _MMCV_OPS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ops = _load_mmcv_ops()
CPU_ONLY_ENV = _ops.CPU_ONLY_ENV
cpu_only_requested = _ops.cpu_only_requested
missing_cuda_ops_message = _ops.missing_cuda_ops_message


class MmcvBuildError(RuntimeError):
    """mmcv cannot be built the way this machine's torch needs (the message says why)."""


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


def main(argv: Sequence[str] = ()) -> int:
    """``python .dev_scripts/mmcv_build_plan.py``: print 'KEY FORCE_CUDA ARCH_LIST
    HIDE_GPUS' for .dev_scripts/build_mmcv_wheel.sh (KEY: the wheel-cache key, torch
    version, Python and :attr:`MmcvBuildPlan.tag`; '-' for no arch list), the note to
    stderr; exit 1 with the message on stderr where mmcv cannot be built as this torch
    needs."""
    if argv:  # no options
        print('usage: python .dev_scripts/mmcv_build_plan.py', file=sys.stderr)
        return 2
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


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
