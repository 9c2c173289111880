"""What a compiled Triton kernel needs of a GPU, and which launch configurations fit it.

One policy for two callers: the launches prune their autotune candidates with it from the
running GPU's properties before any is launched (:mod:`.triton_backend`), and the compile
report (:mod:`.compile_report`, ``tools/analysis_tools/compile_kernels.py``) applies it
to kernels compiled for named targets without a GPU. Imports neither torch nor Triton.

A configuration *fits* when its shared memory is at most the target's per-block limit
(the opt-in maximum of dynamic shared memory) and its registers times its threads are at
most the target's registers per block. Among those that fit, :func:`candidates` keeps
the ones without spill stores, unless every one spills.
"""
import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

__all__ = [
    'Usage', 'Limits', 'TARGET_LIMITS', 'limits_of', 'fits', 'misfit_reason', 'candidates',
    'parse_ptxas', 'ptxas_arch'
]


class Usage(NamedTuple):
    """What one compiled kernel variant uses: registers per thread, spill bytes per thread
    (stores and loads, as ``ptxas -v`` counts them; read from a kernel loaded on a GPU,
    both are its local memory per thread, which the driver reports), shared memory in
    bytes per block, and its threads per block (``num_warps * 32``)."""
    registers: int
    spill_stores: int
    spill_loads: int
    shared: int
    threads: int


class Limits(NamedTuple):
    """A target's per-block limits: shared memory in bytes (the opt-in maximum) and
    registers."""
    shared: int
    registers: int


#: Per compute capability (major * 10 + minor) the per-block limits of NVIDIA's CUDA
#: programming guide ("Technical Specifications per Compute Capability"): the opt-in
#: maximum of shared memory per block and 64 K registers per block.
TARGET_LIMITS: Dict[int, Limits] = {
    70: Limits(96 * 1024, 65536),  # V100
    75: Limits(64 * 1024, 65536),  # T4, RTX 20xx
    80: Limits(163 * 1024, 65536),  # A100, A30
    86: Limits(99 * 1024, 65536),  # A10, A40, RTX 30xx
    87: Limits(163 * 1024, 65536),  # Jetson Orin
    89: Limits(99 * 1024, 65536),  # L4, L40, RTX 40xx
    90: Limits(227 * 1024, 65536),  # H100, H200, GH200
}


def limits_of(capability: int) -> Limits:
    """The limits of compute capability ``capability`` (e.g. 80 for sm_80)."""
    if capability not in TARGET_LIMITS:
        known = ', '.join(f'sm_{c}' for c in sorted(TARGET_LIMITS))
        raise ValueError(f'no limits known for sm_{capability} (known: {known})')
    return TARGET_LIMITS[capability]


def misfit_reason(usage: Usage, limits: Limits) -> Optional[str]:
    """Why a variant with ``usage`` cannot launch within ``limits``, or None if it fits."""
    reasons = []
    if usage.shared > limits.shared:
        reasons.append(f'{usage.shared} B of shared memory > {limits.shared} B')
    if usage.registers * usage.threads > limits.registers:
        reasons.append(f'{usage.registers} registers x {usage.threads} threads > '
                       f'{limits.registers} registers per block')
    return '; '.join(reasons) or None


def fits(usage: Usage, limits: Limits) -> bool:
    """Whether a variant with ``usage`` launches within ``limits``."""
    return misfit_reason(usage, limits) is None


T = TypeVar('T')


def candidates(variants: Sequence[Tuple[T, Optional[Usage]]], limits: Limits) -> List[T]:
    """The configurations the autotuner should time, in the given order.

    Args:
        variants: (configuration, its usage) pairs; a usage of None (not known, e.g. its
            compilation could not be inspected) keeps the configuration, whose launch
            then decides.
        limits: the target's limits.

    Returns:
        the configurations that fit, without the spilling ones unless every fitting one
        spills; empty when none fits.
    """
    fitting = [(cfg, use) for cfg, use in variants if use is None or fits(use, limits)]
    free = [cfg for cfg, use in fitting if use is None or use.spill_stores == 0]
    return free or [cfg for cfg, _ in fitting]


_PTXAS_FIELDS = {
    'registers': re.compile(r'Used (\d+) registers'),
    'spill_stores': re.compile(r'(\d+) bytes spill stores'),
    'spill_loads': re.compile(r'(\d+) bytes spill loads'),
}


def parse_ptxas(log: str) -> Tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) per thread from the output of
    ``ptxas -v`` for one kernel; a ValueError when the output does not say them."""
    found = {name: pattern.findall(log) for name, pattern in _PTXAS_FIELDS.items()}
    missing = [name for name, values in found.items() if not values]
    if missing:
        raise ValueError(f'ptxas -v output names no {", ".join(missing)}: {log[-500:]!r}')
    return tuple(int(found[name][-1]) for name in _PTXAS_FIELDS)


def ptxas_arch(capability: int) -> str:
    """The ``--gpu-name`` Triton passes to ``ptxas`` for ``capability`` (``sm_90a`` for 90
    and later: the architecture-specific features Triton uses there), on every release."""
    return f'sm_{capability}' + ('a' if capability >= 90 else '')
