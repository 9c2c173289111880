"""Triton kernels of the fused polarity-aware linear attention.

Imported by :mod:`polaformer_mm.ops.pola_attention.triton_backend` (and the tests), and only when
Triton is installed. Written against Triton 2.1's API; where a release differs (the precision
of ``tl.dot``, the autotuner's arguments, compiling and loading) :mod:`.triton_compat`
decides. All arithmetic is float32 whatever the storage dtype. Notation as in
:mod:`polaformer_mm.ops.pola_attention.formulation`: ``W`` (2d x (d+2)) is the key summary
(rows 0..d-1 multiply q+, rows d..2d-1 multiply q-; columns: d numerators, then the
denominators of the same-signed and the opposite stream). A feature is
``exp(max(p log max(|x|, tiny) - M, EXP_FLOOR))`` masked by the sign of x, as the torch
path's, so exact zeros give zero features and never raise the shift ``M`` (which is at
least 0).

Every kernel takes, in this order, its tensors, strides and sizes, then the compile-time
arguments every launch passes (``BLOCK_D``, ``PRECISION``, ``TINY``, ``EXP_FLOOR``:
:func:`~.triton_backend.constants`), then those its autotune configurations supply
(``BLOCK_N``, and ``BLOCK_J`` for the key gradient). Launches pass all but the last ones by
position: so the autotune :data:`KEY` is found right by the Triton releases that find it
by position (2.x to 3.1) as by those that find it by name, and the pruning sees every
argument on each (Triton 2.x passes it the positional ones only).
"""
import functools
import os
from typing import List, NamedTuple, Optional

import triton
import triton.language as tl

from . import triton_compat as compat
from .triton_compat import LAUNCH_OPTIONS, OutOfResources, dot, dot_acc  # noqa: F401
from .triton_resources import Limits, Usage, candidates, limits_of, misfit_reason

#: Per kernel, the launch configurations its autotuner may time, once per head width,
#: precision and storage dtypes. Before timing, :func:`fitting_configs` compiles each for
#: the running GPU and keeps those that fit it (:mod:`.triton_resources`). The first is
#: the one the interpreter runs.
#: (BLOCK_N, num_warps, num_stages); the last, single-stage one fits a 99 KiB GPU (RTX 30xx /
#: 40xx, L4, A10) at head width 128, where the double-buffered ones need more shared memory.
_BLOCKS = [(64, 8, 2), (32, 8, 2), (32, 4, 2), (16, 8, 2), (16, 4, 2), (16, 8, 1)]
CONFIGS = {
    name: [compat.make_config({'BLOCK_N': bn}, w, st) for bn, w, st in _BLOCKS]
    for name in ('key_summary', 'query_forward', 'query_backward_rows', 'query_backward',
                 'summary_backward', 'value_backward')
}
# the key gradient tiles its channels too (BLOCK_J of them per program)
CONFIGS['key_backward'] = [
    compat.make_config({
        'BLOCK_N': bn,
        'BLOCK_J': 32
    }, w, st) for bn, w, st in _BLOCKS
]

#: Per kernel, its pointer arguments held in the inputs' storage dtype (the others point to
#: float32 buffers); every other argument that is not a ``tl.constexpr`` is an int32.
STORAGE_ARGS = {
    'key_summary': ('K', 'V'),
    'query_forward': ('Q', 'OUT'),
    'query_backward_rows': ('Q', 'GO'),
    'query_backward': ('Q', 'GO', 'GQ'),
    'summary_backward': ('Q', 'GO'),
    'value_backward': ('K', 'GV'),
    'key_backward': ('K', 'V', 'GK'),
}

#: The int32 arguments besides the strides (``stride_*``); the other arguments that are not
#: a ``tl.constexpr`` are pointers.
INT_ARGS = ('H', 'N', 'n', 'd', 'd1', 'rows_per_split', 'n_splits')


def signature(name: str, storage: str) -> dict:
    """Triton's signature of kernel ``name`` (a key of :data:`KERNELS`) for inputs stored as
    ``storage`` ('fp32', 'fp16' or 'bf16'): what ``triton.compile`` takes to compile it for
    a target without launching it (the compile report)."""
    types = {}
    for param in compat.parameters(KERNELS[name].fn):
        if param.is_constexpr:
            types[param.name] = 'constexpr'
        elif param.name.startswith('stride_') or param.name in INT_ARGS:
            types[param.name] = 'i32'
        else:
            types[param.name] = '*' + (storage if param.name in STORAGE_ARGS[name] else 'fp32')
    return types


#: What the autotuners key on: a head width and a precision get their own timing (the
#: storage dtypes are keyed by Triton itself).
KEY = ['d', 'PRECISION']


class Decision(NamedTuple):
    """One configuration at the pruning: what it uses (None where loading it failed for
    lack of resources) and why it is dropped (None when kept)."""
    config: object
    usage: Optional[Usage]
    dropped: Optional[str]


class RunningGPU:
    """The pruning's target on a GPU: the running GPU's limits from Triton's driver, and
    each configuration compiled for it as its launch would be (Triton caches it for that
    launch) and loaded. ``decisions`` holds the last pruning's :class:`Decision` list."""

    def __init__(self):
        self.decisions: List[Decision] = []

    def limits(self) -> Limits:
        """The running GPU's per-block limits."""
        return compat.device_limits()

    def usage(self, jit_fn, args: dict, options: dict, config) -> Usage:
        """What ``config`` uses when launched with ``args`` and compiler ``options``."""
        return compat.loaded_usage(compat.compile_on_device(jit_fn, args, options, config))


class NamedTarget(RunningGPU):
    """A GPU named by its compute capability, with no GPU at hand: each configuration
    compiled for it through Triton's compiler and assembled by the bundled ``ptxas``, as
    the compile report does. ``limits`` default to the capability's
    (:data:`~.triton_resources.TARGET_LIMITS`)."""

    def __init__(self, capability: int, limits: Optional[Limits] = None):
        super().__init__()
        self.capability = capability
        self._limits = limits if limits is not None else limits_of(capability)

    def limits(self) -> Limits:
        """The limits given (or the capability's)."""
        return self._limits

    def usage(self, jit_fn, args: dict, options: dict, config) -> Usage:
        """What ``config`` uses on the target for arguments of ``args``' types."""
        constexprs = {
            p.name: args[p.name]
            for p in compat.parameters(jit_fn) if p.is_constexpr and p.name in args
        }
        constexprs.update(config.kwargs)
        return compat.usage_on_target(jit_fn, _signature_of(jit_fn, args), constexprs,
                                      self.capability, config.num_warps, config.num_stages)


_POINTEE = {'float32': 'fp32', 'float16': 'fp16', 'bfloat16': 'bf16', 'int32': 'i32'}


def _signature_of(jit_fn, args: dict) -> dict:
    """Triton's signature of ``jit_fn`` for the arguments ``args`` (by name): tensors are
    pointers to their dtype, ints int32, compile-time parameters 'constexpr'."""
    types = {}
    for param in compat.parameters(jit_fn):
        value = args.get(param.name)
        if param.is_constexpr:
            types[param.name] = 'constexpr'
        elif hasattr(value, 'dtype'):
            types[param.name] = '*' + _POINTEE[str(value.dtype).replace('torch.', '')]
        elif isinstance(value, int):
            types[param.name] = 'i32'
        else:
            raise TypeError(f'{jit_fn.__name__}: argument {param.name} = {value!r} is neither a '
                            'tensor nor an int')
    return types


def prune_decisions(jit_fn, configs, args: dict, options: dict, target) -> List[Decision]:
    """Each of ``configs`` compiled for ``target`` (:class:`RunningGPU` or
    :class:`NamedTarget`) with the launch's ``args`` and compiler ``options``, and whether
    the autotuner should time it: those that fit the target, without the spilling ones
    where some do not spill (:func:`~.triton_resources.candidates`)."""
    limits = target.limits()
    usages, out_of_resources = {}, {}
    for index, config in enumerate(configs):
        try:
            usages[index] = target.usage(jit_fn, args, options, config)
        except OutOfResources as error:  # too much shared memory or too many threads
            out_of_resources[index] = str(error)
    kept = set(candidates(list(usages.items()), limits))
    decisions = []
    for index, config in enumerate(configs):
        usage = usages.get(index)
        if index in out_of_resources:
            why = out_of_resources[index]
        elif index in kept:
            why = None
        else:
            why = misfit_reason(
                usage,
                limits) or (f'{usage.spill_stores} B of spill stores per thread, where other '
                            'configurations fit without')
        decisions.append(Decision(config, usage, why))
    return decisions


def fitting_configs(jit_fn,
                    configs,
                    named_args: dict,
                    target: Optional[RunningGPU] = None,
                    **launch) -> list:
    """The autotuner's ``early_config_prune`` (bound to ``jit_fn``): of ``configs``, those
    :func:`prune_decisions` keeps for ``target`` (default: the running GPU); all of them
    if none fits, so that the launch names the problem.

    Triton passes ``named_args`` (the arguments given by position, by name) and, from 3.0
    on, the launch's keyword arguments (``launch``: its compiler options, ``grid``,
    ``warmup``). The decisions are kept in ``target.decisions``.
    """
    target = target if target is not None else _RUNNING_GPU
    decisions = prune_decisions(jit_fn, configs, named_args, compat.split_launch(launch), target)
    target.decisions = decisions
    return [d.config for d in decisions if d.dropped is None] or list(configs)


_RUNNING_GPU = RunningGPU()


def autotuned_parameters_last(jit_fn, configs) -> bool:
    """Whether every argument ``configs`` supply comes after all the others in
    ``jit_fn``'s signature (what makes a key found by position right)."""
    supplied = set().union(*(set(c.kwargs) for c in configs))
    names = [p.name for p in compat.parameters(jit_fn)]
    return set(names[len(names) - len(supplied):]) == supplied


def _autotune(name):
    # Triton's interpreter (TRITON_INTERPRET=1, read before Triton is imported) runs one
    # configuration: with several, the autotuner times them through the GPU (every Triton
    # release, even for a single pruned configuration), which the interpreter does not have.
    interpreting = os.environ.get('TRITON_INTERPRET', '0') == '1'

    def wrap(jit_fn):
        if interpreting:
            return compat.autotune(CONFIGS[name][:1], KEY)(jit_fn)
        return compat.autotune(CONFIGS[name], KEY, functools.partial(fitting_configs, jit_fn))(
            jit_fn)

    return wrap


@triton.jit
def _log_abs(x, TINY: tl.constexpr):
    return tl.log(tl.maximum(tl.abs(x), TINY))


@triton.jit
def _feature(scaled, shift, EXP_FLOOR: tl.constexpr):
    """``exp(max(scaled - shift, EXP_FLOOR))``: a feature below its shift, floored as the
    torch path's (:func:`~.formulation.exp_floor`)."""
    return tl.exp(tl.maximum(scaled - shift, EXP_FLOOR))


@triton.jit
def _on_stream(x, sign):
    """Whether the entries of x belong to the stream ``sign`` (0: x > 0, 1: x < 0)."""
    return ((x > 0) & (sign == 0)) | ((x < 0) & (sign == 1))


@triton.jit
def _signed_magnitude(x, TINY: tl.constexpr):
    """``sign(x) max(|x|, TINY)`` (TINY at 0): the divisor of a feature's gradient, which
    the torch path takes too (``sign(x) / max(|x|, tiny)``), so that subnormal x gets the
    same gradient."""
    magnitude = tl.maximum(tl.abs(x), TINY)
    return tl.where(x < 0, -magnitude, magnitude)


@triton.jit
def _scaled_eps(eps, shift, k_shift, TINY: tl.constexpr, EXP_FLOOR: tl.constexpr):
    """eps * exp(-(M_q + M_k)), at least the smallest normal number, as the torch path's
    (:func:`~.shared_shifts.scaled_eps`)."""
    return tl.maximum(eps * tl.exp(tl.maximum(-(shift + k_shift), EXP_FLOOR)), TINY)


@triton.jit
def _load_block(base, offs_n, offs_d, stride_n, stride_d, mask):
    ptrs = base + offs_n[:, None] * stride_n + offs_d[None, :] * stride_d
    return tl.load(ptrs, mask=mask, other=0.).to(tl.float32)


@triton.jit
def _store_block(base, value, offs_n, offs_d, stride_n, stride_d, mask):
    ptrs = base + offs_n[:, None] * stride_n + offs_d[None, :] * stride_d
    tl.store(ptrs, value.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _load_square(base, offs_d, row_stride, d_mask):
    """A (BLOCK_D, BLOCK_D) block of float32 rows ``row_stride`` apart."""
    mask = d_mask[:, None] & d_mask[None, :]
    return tl.load(base + offs_d[:, None] * row_stride + offs_d[None, :], mask=mask, other=0.)


@triton.jit
def _load_denominators(W, offs_d, d, d_mask):
    """The denominator columns of W: those of the same-signed and of the opposite stream,
    for the rows that q+ and q- multiply."""
    den_s_pos = tl.load(W + offs_d * (d + 2) + d, mask=d_mask, other=0.)
    den_s_neg = tl.load(W + (d + offs_d) * (d + 2) + d, mask=d_mask, other=0.)
    den_o_pos = tl.load(W + offs_d * (d + 2) + d + 1, mask=d_mask, other=0.)
    den_o_neg = tl.load(W + (d + offs_d) * (d + 2) + d + 1, mask=d_mask, other=0.)
    return den_s_pos, den_s_neg, den_o_pos, den_o_neg


@_autotune('key_summary')
@triton.jit
def key_summary_kernel(K, V, P, KV, KMEAN, KMAX, stride_kb, stride_kh, stride_kn, stride_kd,
                       stride_vb, stride_vh, stride_vn, stride_vd, H, n, d, rows_per_split,
                       n_splits, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, TINY: tl.constexpr,
                       EXP_FLOOR: tl.constexpr, BLOCK_N: tl.constexpr):
    """Per (batch*head, split, stream): k_s^T v, the feature sums and the shift used.

    Within a split the shift is the running max of p log|k| over both streams (at least
    0); the accumulators are rescaled when it grows. The caller rescales the splits to
    their common max and adds them.
    """
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    sign = tl.program_id(2)  # 0: k+, 1: k-
    b = (pid_bh // H).to(tl.int64)
    hh = pid_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < d
    p = tl.load(P + hh * d + offs_d, mask=d_mask, other=1.)
    k_base = K + b * stride_kb + hh * stride_kh
    v_base = V + b * stride_vb + hh * stride_vh

    acc = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
    sums = tl.zeros([BLOCK_D], dtype=tl.float32)
    shift = tl.max(tl.zeros([BLOCK_D], dtype=tl.float32), axis=0)
    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, n)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask = (offs_n < end)[:, None] & d_mask[None, :]
        k = _load_block(k_base, offs_n, offs_d, stride_kn, stride_kd, mask)
        scaled = _log_abs(k, TINY) * p[None, :]
        new_shift = tl.maximum(shift, tl.max(scaled))
        rescale = tl.exp(shift - new_shift)
        k_own = tl.where(_on_stream(k, sign), _feature(scaled, new_shift, EXP_FLOOR), 0.)
        v = _load_block(v_base, offs_n, offs_d, stride_vn, stride_vd, mask)
        acc = dot_acc(tl.trans(k_own), v, acc * rescale, PRECISION)
        sums = sums * rescale + tl.sum(k_own, axis=0)
        shift = new_shift

    part = (pid_bh * n_splits + pid_s).to(tl.int64)
    kv_mask = d_mask[:, None] & d_mask[None, :]
    rows = sign * d + offs_d
    tl.store(KV + part * (2 * d * d) + rows[:, None] * d + offs_d[None, :], acc, mask=kv_mask)
    tl.store(KMEAN + part * (2 * d) + rows, sums, mask=d_mask)
    tl.store(KMAX + part, shift, mask=sign == 0)


@triton.jit
def _query_features(q, p, TINY: tl.constexpr, EXP_FLOOR: tl.constexpr):
    log_abs = _log_abs(q, TINY)
    scaled = log_abs * p[None, :]
    shift = tl.maximum(tl.max(scaled, axis=1), 0.)
    phi = _feature(scaled, shift[:, None], EXP_FLOOR)
    return tl.where(q > 0, phi, 0.), tl.where(q < 0, phi, 0.), shift, log_abs


@triton.jit
def _reciprocal_denominators(q_pos, q_neg, shift, W, offs_d, d, d_mask, eps, k_shift,
                             TINY: tl.constexpr, EXP_FLOOR: tl.constexpr):
    """Per query row, 1 / (denominator + scaled eps) of the same-signed and the opposite
    stream."""
    den_s_pos, den_s_neg, den_o_pos, den_o_neg = _load_denominators(W, offs_d, d, d_mask)
    den_s = tl.sum(q_pos * den_s_pos[None, :] + q_neg * den_s_neg[None, :], axis=1)
    den_o = tl.sum(q_pos * den_o_pos[None, :] + q_neg * den_o_neg[None, :], axis=1)
    eps_scaled = _scaled_eps(eps, shift, k_shift, TINY, EXP_FLOOR)
    return 1. / (den_s + eps_scaled), 1. / (den_o + eps_scaled)


@triton.jit
def _numerators(q_pos, q_neg, W, offs_d, d, d_mask, PRECISION: tl.constexpr):
    """[q+, q-] times the numerator columns of W, one stream's rows after the other."""
    num = dot(q_pos, _load_square(W, offs_d, d + 2, d_mask), PRECISION)
    w_neg = _load_square(W + d * (d + 2), offs_d, d + 2, d_mask)
    return dot_acc(q_neg, w_neg, num, PRECISION)


@_autotune('query_forward')
@triton.jit
def query_forward_kernel(Q, W, P, EPS, KMAX, OUT, LARGEST_INV_DEN, stride_qb, stride_qh, stride_qn,
                         stride_qd, stride_ob, stride_oh, stride_on, stride_od, H, N, d, d1,
                         rows_per_split, n_splits, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                         TINY: tl.constexpr, EXP_FLOOR: tl.constexpr, BLOCK_N: tl.constexpr):
    """Blocks of queries: features in registers, times W, divided per stream.
    LARGEST_INV_DEN gets per (batch*head, split) the largest reciprocal denominator of its
    rows, which tells the caller whether the shared shifts carried them."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    hh = pid_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < d
    first = offs_d[None, :] < d1
    p = tl.load(P + hh * d + offs_d, mask=d_mask, other=1.)
    w_base = W + pid_bh.to(tl.int64) * (2 * d * (d + 2))
    eps = tl.load(EPS + pid_bh)
    k_shift = tl.load(KMAX + pid_bh)
    q_base = Q + b * stride_qb + hh * stride_qh
    out_base = OUT + b * stride_ob + hh * stride_oh

    largest_inv_den = tl.max(tl.zeros([BLOCK_N], dtype=tl.float32), axis=0)
    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, N)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        rows = offs_n < end
        mask = rows[:, None] & d_mask[None, :]
        q = _load_block(q_base, offs_n, offs_d, stride_qn, stride_qd, mask)
        q_pos, q_neg, shift, _ = _query_features(q, p, TINY, EXP_FLOOR)
        inv_s, inv_o = _reciprocal_denominators(q_pos, q_neg, shift, w_base, offs_d, d, d_mask, eps,
                                                k_shift, TINY, EXP_FLOOR)
        block_largest = tl.max(tl.where(rows, tl.maximum(inv_s, inv_o), 0.), axis=0)
        largest_inv_den = tl.maximum(largest_inv_den, block_largest)
        num = _numerators(q_pos, q_neg, w_base, offs_d, d, d_mask, PRECISION)
        out = num * tl.where(first, inv_s[:, None], inv_o[:, None])
        _store_block(out_base, out, offs_n, offs_d, stride_on, stride_od, mask)
    tl.store(LARGEST_INV_DEN + pid_bh * n_splits + pid_s, largest_inv_den)


@_autotune('query_backward_rows')
@triton.jit
def query_backward_rows_kernel(Q, GO, W, P, EPS, KMAX, A, stride_qb, stride_qh, stride_qn,
                               stride_qd, stride_gob, stride_goh, stride_gon, stride_god, H, N, d,
                               d1, rows_per_split, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                               TINY: tl.constexpr, EXP_FLOOR: tl.constexpr, BLOCK_N: tl.constexpr):
    """Per query row, the gradients of its two denominators (A, (batch*head, N, 2)):
    ``-(1 / den) * sum of g_c * out_c`` over each stream's channels."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    hh = pid_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < d
    first = offs_d[None, :] < d1
    p = tl.load(P + hh * d + offs_d, mask=d_mask, other=1.)
    w_base = W + pid_bh.to(tl.int64) * (2 * d * (d + 2))
    eps = tl.load(EPS + pid_bh)
    k_shift = tl.load(KMAX + pid_bh)
    q_base = Q + b * stride_qb + hh * stride_qh
    go_base = GO + b * stride_gob + hh * stride_goh
    a_base = A + pid_bh.to(tl.int64) * (2 * N)

    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, N)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        rows = offs_n < end
        mask = rows[:, None] & d_mask[None, :]
        q = _load_block(q_base, offs_n, offs_d, stride_qn, stride_qd, mask)
        q_pos, q_neg, shift, _ = _query_features(q, p, TINY, EXP_FLOOR)
        inv_s, inv_o = _reciprocal_denominators(q_pos, q_neg, shift, w_base, offs_d, d, d_mask, eps,
                                                k_shift, TINY, EXP_FLOOR)
        go_num = _numerators(q_pos, q_neg, w_base, offs_d, d, d_mask, PRECISION)
        go_num *= _load_block(go_base, offs_n, offs_d, stride_gon, stride_god, mask)
        a_s = -inv_s * inv_s * tl.sum(tl.where(first, go_num, 0.), axis=1)
        a_o = -inv_o * inv_o * tl.sum(tl.where(first, 0., go_num), axis=1)
        tl.store(a_base + 2 * offs_n, a_s, mask=rows)
        tl.store(a_base + 2 * offs_n + 1, a_o, mask=rows)


@triton.jit
def _query_block_grads(q_base, go_base, a_base, w_base, p, eps, k_shift, sign, offs_n, offs_d, mask,
                       rows, first, d, d_mask, stride_qn, stride_qd, stride_gon, stride_god,
                       TINY: tl.constexpr, EXP_FLOOR: tl.constexpr):
    """For a block of query rows and the stream ``sign`` (0: q+, 1: q-): q, its
    log-magnitudes, the stream's features, the gradient of the numerators (g / den) and
    those of the denominators."""
    q = _load_block(q_base, offs_n, offs_d, stride_qn, stride_qd, mask)
    q_pos, q_neg, shift, log_abs = _query_features(q, p, TINY, EXP_FLOOR)
    inv_s, inv_o = _reciprocal_denominators(q_pos, q_neg, shift, w_base, offs_d, d, d_mask, eps,
                                            k_shift, TINY, EXP_FLOOR)
    q_own = tl.where(_on_stream(q, sign), q_pos + q_neg, 0.)
    g_num = _load_block(go_base, offs_n, offs_d, stride_gon, stride_god, mask)
    g_num *= tl.where(first, inv_s[:, None], inv_o[:, None])
    a_s = tl.load(a_base + 2 * offs_n, mask=rows, other=0.)
    a_o = tl.load(a_base + 2 * offs_n + 1, mask=rows, other=0.)
    return q, log_abs, q_own, g_num, a_s, a_o


@_autotune('query_backward')
@triton.jit
def query_backward_kernel(Q, GO, W, P, EPS, KMAX, A, GQ, GP, stride_qb, stride_qh, stride_qn,
                          stride_qd, stride_gob, stride_goh, stride_gon, stride_god, stride_gqb,
                          stride_gqh, stride_gqn, stride_gqd, H, N, d, d1, rows_per_split, n_splits,
                          BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, TINY: tl.constexpr,
                          EXP_FLOOR: tl.constexpr, BLOCK_N: tl.constexpr):
    """Per (batch*head, split, stream): the gradient of q on the stream's entries (q >= 0
    for q+, q < 0 for q-) and the partial gradient of the exponent. Takes the
    denominators' gradients of :func:`query_backward_rows_kernel` (A)."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    sign = tl.program_id(2)  # 0: q+, 1: q-
    b = (pid_bh // H).to(tl.int64)
    hh = pid_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < d
    first = offs_d[None, :] < d1
    p = tl.load(P + hh * d + offs_d, mask=d_mask, other=1.)
    w_base = W + pid_bh.to(tl.int64) * (2 * d * (d + 2))
    w_own_base = w_base + sign * d * (d + 2)
    den_s_own = tl.load(w_own_base + offs_d * (d + 2) + d, mask=d_mask, other=0.)
    den_o_own = tl.load(w_own_base + offs_d * (d + 2) + d + 1, mask=d_mask, other=0.)
    eps = tl.load(EPS + pid_bh)
    k_shift = tl.load(KMAX + pid_bh)
    q_base = Q + b * stride_qb + hh * stride_qh
    go_base = GO + b * stride_gob + hh * stride_goh
    gq_base = GQ + b * stride_gqb + hh * stride_gqh
    a_base = A + pid_bh.to(tl.int64) * (2 * N)

    acc_p = tl.zeros([BLOCK_D], dtype=tl.float32)
    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, N)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        rows = offs_n < end
        mask = rows[:, None] & d_mask[None, :]
        q, log_abs, q_own, g_num, a_s, a_o = _query_block_grads(q_base, go_base, a_base, w_base, p,
                                                                eps, k_shift, sign, offs_n, offs_d,
                                                                mask, rows, first, d, d_mask,
                                                                stride_qn, stride_qd, stride_gon,
                                                                stride_god, TINY, EXP_FLOOR)
        w_own = _load_square(w_own_base, offs_d, d + 2, d_mask)
        g_own = dot(g_num, tl.trans(w_own), PRECISION)
        g_own += a_s[:, None] * den_s_own[None, :] + a_o[:, None] * den_o_own[None, :]
        r = g_own * q_own  # g * f on the stream's entries
        acc_p += tl.sum(r * log_abs, axis=0)
        g_q = r * p[None, :] / _signed_magnitude(q, TINY)
        stored = mask & ((q < 0) == (sign == 1))  # q+ takes the zeros
        _store_block(gq_base, g_q, offs_n, offs_d, stride_gqn, stride_gqd, stored)

    part = (pid_bh * n_splits + pid_s).to(tl.int64)
    tl.store(GP + (part * 2 + sign) * d + offs_d, acc_p, mask=d_mask)


@_autotune('summary_backward')
@triton.jit
def summary_backward_kernel(Q, GO, W, P, EPS, KMAX, A, GW, stride_qb, stride_qh, stride_qn,
                            stride_qd, stride_gob, stride_goh, stride_gon, stride_god, H, N, d, d1,
                            rows_per_split, n_splits, BLOCK_D: tl.constexpr,
                            PRECISION: tl.constexpr, TINY: tl.constexpr, EXP_FLOOR: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    """Per (batch*head, split, stream): the partial gradient of the stream's rows of W,
    ``q_s^T (g / den)`` and the denominator columns. Takes the denominators' gradients of
    :func:`query_backward_rows_kernel` (A)."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    sign = tl.program_id(2)  # 0: q+, 1: q-
    b = (pid_bh // H).to(tl.int64)
    hh = pid_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < d
    first = offs_d[None, :] < d1
    p = tl.load(P + hh * d + offs_d, mask=d_mask, other=1.)
    w_base = W + pid_bh.to(tl.int64) * (2 * d * (d + 2))
    eps = tl.load(EPS + pid_bh)
    k_shift = tl.load(KMAX + pid_bh)
    q_base = Q + b * stride_qb + hh * stride_qh
    go_base = GO + b * stride_gob + hh * stride_goh
    a_base = A + pid_bh.to(tl.int64) * (2 * N)

    acc_w = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
    acc_s = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc_o = tl.zeros([BLOCK_D], dtype=tl.float32)
    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, N)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        rows = offs_n < end
        mask = rows[:, None] & d_mask[None, :]
        q, log_abs, q_own, g_num, a_s, a_o = _query_block_grads(q_base, go_base, a_base, w_base, p,
                                                                eps, k_shift, sign, offs_n, offs_d,
                                                                mask, rows, first, d, d_mask,
                                                                stride_qn, stride_qd, stride_gon,
                                                                stride_god, TINY, EXP_FLOOR)
        acc_w = dot_acc(tl.trans(q_own), g_num, acc_w, PRECISION)
        acc_s += tl.sum(q_own * a_s[:, None], axis=0)
        acc_o += tl.sum(q_own * a_o[:, None], axis=0)

    part = (pid_bh * n_splits + pid_s).to(tl.int64)
    gw_base = GW + part * (2 * d * (d + 2)) + sign * d * (d + 2)
    w_mask = d_mask[:, None] & d_mask[None, :]
    tl.store(gw_base + offs_d[:, None] * (d + 2) + offs_d[None, :], acc_w, mask=w_mask)
    tl.store(gw_base + offs_d * (d + 2) + d, acc_s, mask=d_mask)
    tl.store(gw_base + offs_d * (d + 2) + d + 1, acc_o, mask=d_mask)


@_autotune('value_backward')
@triton.jit
def value_backward_kernel(K, P, KMAX, GKV, GV, stride_kb, stride_kh, stride_kn, stride_kd,
                          stride_gvb, stride_gvh, stride_gvn, stride_gvd, H, n, d, rows_per_split,
                          BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, TINY: tl.constexpr,
                          EXP_FLOOR: tl.constexpr, BLOCK_N: tl.constexpr):
    """The gradient of v from that of [k+, k-]^T v / n (GKV): [k+, k-] GKV."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    hh = pid_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < d
    p = tl.load(P + hh * d + offs_d, mask=d_mask, other=1.)
    k_shift = tl.load(KMAX + pid_bh)
    gkv_base = GKV + pid_bh.to(tl.int64) * (2 * d * d)
    k_base = K + b * stride_kb + hh * stride_kh
    gv_base = GV + b * stride_gvb + hh * stride_gvh

    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, n)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask = (offs_n < end)[:, None] & d_mask[None, :]
        k = _load_block(k_base, offs_n, offs_d, stride_kn, stride_kd, mask)
        phi = _feature(_log_abs(k, TINY) * p[None, :], k_shift, EXP_FLOOR)
        g_kv_pos = _load_square(gkv_base, offs_d, d, d_mask)
        g_v = dot(tl.where(k > 0, phi, 0.), g_kv_pos, PRECISION)
        g_kv_neg = _load_square(gkv_base + d * d, offs_d, d, d_mask)
        g_v = dot_acc(tl.where(k < 0, phi, 0.), g_kv_neg, g_v, PRECISION)
        _store_block(gv_base, g_v, offs_n, offs_d, stride_gvn, stride_gvd, mask)


@_autotune('key_backward')
@triton.jit
def key_backward_kernel(K, V, P, KMAX, GKV, GMEAN, GK, GP, stride_kb, stride_kh, stride_kn,
                        stride_kd, stride_vb, stride_vh, stride_vn, stride_vd, stride_gkb,
                        stride_gkh, stride_gkn, stride_gkd, H, n, d, rows_per_split, n_splits,
                        BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, TINY: tl.constexpr,
                        EXP_FLOOR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr):
    """Per (batch*head, split, stream and tile of BLOCK_J key channels): the gradient of k on
    the stream's entries (k >= 0 for k+, k < 0 for k-) from those of [k+, k-]^T v / n (GKV)
    and the key means, and the partial gradient of the exponent. A key channel's gradient
    needs only its own column of features, so the channels are tiled."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    sign = tl.program_id(2) % 2  # 0: k+, 1: k-
    b = (pid_bh // H).to(tl.int64)
    hh = pid_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < d
    offs_j = (tl.program_id(2) // 2) * BLOCK_J + tl.arange(0, BLOCK_J)
    j_mask = offs_j < d
    p = tl.load(P + hh * d + offs_j, mask=j_mask, other=1.)
    k_shift = tl.load(KMAX + pid_bh)
    gkv_own = GKV + pid_bh.to(tl.int64) * (2 * d * d) + sign * d * d
    g_mean = tl.load(
        GMEAN + pid_bh.to(tl.int64) * (2 * d) + sign * d + offs_j, mask=j_mask, other=0.)
    k_base = K + b * stride_kb + hh * stride_kh
    v_base = V + b * stride_vb + hh * stride_vh
    gk_base = GK + b * stride_gkb + hh * stride_gkh

    acc_p = tl.zeros([BLOCK_J], dtype=tl.float32)
    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, n)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        rows = offs_n < end
        mask = rows[:, None] & j_mask[None, :]
        v = _load_block(v_base, offs_n, offs_d, stride_vn, stride_vd,
                        rows[:, None] & d_mask[None, :])
        g_kv = tl.load(
            gkv_own + offs_j[:, None] * d + offs_d[None, :],
            mask=j_mask[:, None] & d_mask[None, :],
            other=0.)
        g_own = dot(v, tl.trans(g_kv), PRECISION) + g_mean[None, :]
        k = _load_block(k_base, offs_n, offs_j, stride_kn, stride_kd, mask)
        log_abs = _log_abs(k, TINY)
        k_own = tl.where(
            _on_stream(k, sign), _feature(log_abs * p[None, :], k_shift, EXP_FLOOR), 0.)
        r = g_own * k_own
        acc_p += tl.sum(r * log_abs, axis=0)
        g_k = r * p[None, :] / _signed_magnitude(k, TINY)
        stored = mask & ((k < 0) == (sign == 1))  # k+ takes the zeros
        _store_block(gk_base, g_k, offs_n, offs_j, stride_gkn, stride_gkd, stored)

    part = (pid_bh * n_splits + pid_s).to(tl.int64)
    tl.store(GP + (part * 2 + sign) * d + offs_j, acc_p, mask=j_mask)


#: Every kernel by name, in the order of a forward and a backward pass.
KERNELS = {
    'key_summary': key_summary_kernel,
    'query_forward': query_forward_kernel,
    'query_backward_rows': query_backward_rows_kernel,
    'query_backward': query_backward_kernel,
    'summary_backward': summary_backward_kernel,
    'value_backward': value_backward_kernel,
    'key_backward': key_backward_kernel,
}
