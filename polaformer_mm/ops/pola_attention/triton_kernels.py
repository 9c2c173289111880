"""Triton kernels of the fused polarity-aware linear attention.

Imported by :mod:`polaformer_mm.ops.pola_attention.triton_backend` (and the tests), and only when
Triton is installed. All arithmetic is float32 whatever the storage dtype. Notation as in
:mod:`polaformer_mm.ops.pola_attention.formulation`: ``W`` (2d x (d+2)) is the key summary (rows
0..d-1 multiply q+, rows d..2d-1 multiply q-; columns: d numerators, then the
denominators of the same-signed and the opposite stream). A feature is
``exp(p log max(|x|, tiny) - M)`` masked by the sign of x, so exact zeros give zero
features and never raise the shift ``M`` (which is at least 0).
"""
import functools
import os
from typing import Optional

import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .triton_resources import Limits, Usage, candidates

#: Per kernel, the launch configurations its autotuner may time, once per head width,
#: precision and storage dtypes. Before timing, :func:`fitting_configs` compiles each for
#: the running GPU and keeps those that fit it (:mod:`.triton_resources`). The first is
#: the one the interpreter runs.
#: (BLOCK_N, num_warps, num_stages); the last, single-stage one fits a 99 KiB GPU (RTX 30xx /
#: 40xx, L4, A10) at head width 128, where the double-buffered ones need more shared memory.
_BLOCKS = [(64, 8, 2), (32, 8, 2), (32, 4, 2), (16, 8, 2), (16, 4, 2), (16, 8, 1)]
CONFIGS = {
    name: [triton.Config({'BLOCK_N': bn}, num_warps=w, num_stages=st) for bn, w, st in _BLOCKS]
    for name in ('key_summary', 'query_forward', 'query_backward_rows', 'query_backward',
                 'summary_backward', 'value_backward')
}
# the key gradient tiles its channels too (BLOCK_J of them per program)
CONFIGS['key_backward'] = [
    triton.Config({
        'BLOCK_N': bn,
        'BLOCK_J': 32
    }, num_warps=w, num_stages=st) for bn, w, st in _BLOCKS
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
    for param in KERNELS[name].fn.params:
        if param.is_constexpr:
            types[param.name] = 'constexpr'
        elif param.name.startswith('stride_') or param.name in INT_ARGS:
            types[param.name] = 'i32'
        else:
            types[param.name] = '*' + (storage if param.name in STORAGE_ARGS[name] else 'fp32')
    return types


def _device_limits():
    """The running GPU's per-block limits, from Triton's driver."""
    from triton.runtime import driver
    props = driver.active.utils.get_device_properties(driver.active.get_current_device())
    return Limits(shared=props['max_shared_mem'], registers=props['max_num_regs'])


def _usage(jit_fn, args: dict, meta: dict, config) -> Optional[Usage]:
    """Compile ``config`` for the running GPU (Triton caches it for the launch) and read
    what it uses; None where this Triton does not say. Raises Triton's ``OutOfResources``
    when loading it on the GPU fails for lack of shared memory or threads."""
    try:
        compiled = jit_fn.warmup(**args, **meta, **config.all_kwargs(), grid=(1, ))
        compiled._init_handles()  # loads the binary: registers and local memory
        threads = compiled.metadata.num_warps * 32
        return Usage(compiled.n_regs, compiled.n_spills, compiled.n_spills,
                     compiled.metadata.shared, threads)
    except OutOfResources:
        raise
    except Exception:  # noqa: BLE001  (an older Triton's API; the launch decides)
        return None


def fitting_configs(jit_fn, configs, named_args, **meta):
    """The autotuner's ``early_config_prune``: of ``configs``, the ones that fit the
    running GPU, without spilling ones where some do not spill
    (:func:`~.triton_resources.candidates`); all of them if none fits, so that the launch
    names the problem."""
    limits = _device_limits()
    variants = []
    for config in configs:
        try:
            variants.append((config, _usage(jit_fn, named_args, meta, config)))
        except OutOfResources:
            continue  # too much shared memory or too many threads for this GPU
    return candidates(variants, limits) or list(configs)


def _autotune(name):
    # Triton's interpreter (TRITON_INTERPRET=1, read before Triton is imported) runs one
    # configuration: the autotuner times its configurations through the GPU driver, which the
    # interpreter may not have (Triton 3.7 asks for it even for a single pruned configuration).
    interpreting = os.environ.get('TRITON_INTERPRET', '0') == '1'

    def wrap(jit_fn):
        if interpreting:
            return triton.autotune(configs=CONFIGS[name][:1], key=['d', 'PRECISION'])(jit_fn)
        prune = functools.partial(fitting_configs, jit_fn)
        return triton.autotune(
            configs=CONFIGS[name],
            key=['d', 'PRECISION'],
            prune_configs_by={'early_config_prune': prune})(
                jit_fn)

    return wrap


@triton.jit
def _log_abs(x, TINY: tl.constexpr):
    return tl.log(tl.maximum(tl.abs(x), TINY))


@triton.jit
def _scaled_eps(eps, shift, k_shift, TINY: tl.constexpr):
    """eps * exp(-(M_q + M_k)), at least the smallest normal number."""
    log_tiny = tl.log(TINY)
    return tl.maximum(eps * tl.exp(tl.maximum(-(shift + k_shift), log_tiny)), TINY)


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
                       n_splits, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       PRECISION: tl.constexpr, TINY: tl.constexpr):
    """Per (batch*head, split, stream): k_s^T v, the feature sums and the shift used.

    Within a split the shift is the running max of p log|k| over both streams (at least
    0); the accumulators are rescaled when it grows. The caller rescales the splits to
    their common max and adds them.
    """
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    sign = tl.program_id(2)  # 0: k+, 1: k-
    own = 1. - 2. * sign.to(tl.float32)  # k * own > 0 on this stream's entries
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
        k_own = tl.where(k * own > 0, tl.exp(scaled - new_shift), 0.)
        v = _load_block(v_base, offs_n, offs_d, stride_vn, stride_vd, mask)
        acc = tl.dot(tl.trans(k_own), v, acc * rescale, input_precision=PRECISION)
        sums = sums * rescale + tl.sum(k_own, axis=0)
        shift = new_shift

    part = (pid_bh * n_splits + pid_s).to(tl.int64)
    kv_mask = d_mask[:, None] & d_mask[None, :]
    rows = sign * d + offs_d
    tl.store(KV + part * (2 * d * d) + rows[:, None] * d + offs_d[None, :], acc, mask=kv_mask)
    tl.store(KMEAN + part * (2 * d) + rows, sums, mask=d_mask)
    tl.store(KMAX + part, shift, mask=sign == 0)


@triton.jit
def _query_features(q, p, TINY: tl.constexpr):
    log_abs = _log_abs(q, TINY)
    scaled = log_abs * p[None, :]
    shift = tl.maximum(tl.max(scaled, axis=1), 0.)
    phi = tl.exp(scaled - shift[:, None])
    return tl.where(q > 0, phi, 0.), tl.where(q < 0, phi, 0.), shift, log_abs


@triton.jit
def _reciprocal_denominators(q_pos, q_neg, shift, W, offs_d, d, d_mask, eps, k_shift,
                             TINY: tl.constexpr):
    """Per query row, 1 / (denominator + scaled eps) of the same-signed and the opposite
    stream."""
    den_s_pos, den_s_neg, den_o_pos, den_o_neg = _load_denominators(W, offs_d, d, d_mask)
    den_s = tl.sum(q_pos * den_s_pos[None, :] + q_neg * den_s_neg[None, :], axis=1)
    den_o = tl.sum(q_pos * den_o_pos[None, :] + q_neg * den_o_neg[None, :], axis=1)
    eps_scaled = _scaled_eps(eps, shift, k_shift, TINY)
    return 1. / (den_s + eps_scaled), 1. / (den_o + eps_scaled)


@triton.jit
def _numerators(q_pos, q_neg, W, offs_d, d, d_mask, PRECISION: tl.constexpr):
    """[q+, q-] times the numerator columns of W, one stream's rows after the other."""
    num = tl.dot(q_pos, _load_square(W, offs_d, d + 2, d_mask), input_precision=PRECISION)
    w_neg = _load_square(W + d * (d + 2), offs_d, d + 2, d_mask)
    return tl.dot(q_neg, w_neg, num, input_precision=PRECISION)


@_autotune('query_forward')
@triton.jit
def query_forward_kernel(Q, W, P, EPS, KMAX, OUT, LARGEST_INV_DEN, stride_qb, stride_qh, stride_qn,
                         stride_qd, stride_ob, stride_oh, stride_on, stride_od, H, N, d, d1,
                         rows_per_split, n_splits, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         PRECISION: tl.constexpr, TINY: tl.constexpr):
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
        q_pos, q_neg, shift, _ = _query_features(q, p, TINY)
        inv_s, inv_o = _reciprocal_denominators(q_pos, q_neg, shift, w_base, offs_d, d, d_mask, eps,
                                                k_shift, TINY)
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
                               d1, rows_per_split, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                               PRECISION: tl.constexpr, TINY: tl.constexpr):
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
        q_pos, q_neg, shift, _ = _query_features(q, p, TINY)
        inv_s, inv_o = _reciprocal_denominators(q_pos, q_neg, shift, w_base, offs_d, d, d_mask, eps,
                                                k_shift, TINY)
        go_num = _numerators(q_pos, q_neg, w_base, offs_d, d, d_mask, PRECISION)
        go_num *= _load_block(go_base, offs_n, offs_d, stride_gon, stride_god, mask)
        a_s = -inv_s * inv_s * tl.sum(tl.where(first, go_num, 0.), axis=1)
        a_o = -inv_o * inv_o * tl.sum(tl.where(first, 0., go_num), axis=1)
        tl.store(a_base + 2 * offs_n, a_s, mask=rows)
        tl.store(a_base + 2 * offs_n + 1, a_o, mask=rows)


@triton.jit
def _query_block_grads(q_base, go_base, a_base, w_base, p, eps, k_shift, own, offs_n, offs_d, mask,
                       rows, first, d, d_mask, stride_qn, stride_qd, stride_gon, stride_god,
                       TINY: tl.constexpr):
    """For a block of query rows and one stream: q, its log-magnitudes, the stream's
    features, the gradient of the numerators (g / den) and those of the denominators."""
    q = _load_block(q_base, offs_n, offs_d, stride_qn, stride_qd, mask)
    q_pos, q_neg, shift, log_abs = _query_features(q, p, TINY)
    inv_s, inv_o = _reciprocal_denominators(q_pos, q_neg, shift, w_base, offs_d, d, d_mask, eps,
                                            k_shift, TINY)
    q_own = tl.where(q * own > 0, q_pos + q_neg, 0.)
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
                          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                          TINY: tl.constexpr):
    """Per (batch*head, split, stream): the gradient of q on the stream's entries (q >= 0
    for q+, q < 0 for q-) and the partial gradient of the exponent. Takes the
    denominators' gradients of :func:`query_backward_rows_kernel` (A)."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    sign = tl.program_id(2)  # 0: q+, 1: q-
    own = 1. - 2. * sign.to(tl.float32)
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
                                                                eps, k_shift, own, offs_n, offs_d,
                                                                mask, rows, first, d, d_mask,
                                                                stride_qn, stride_qd, stride_gon,
                                                                stride_god, TINY)
        w_own = _load_square(w_own_base, offs_d, d + 2, d_mask)
        g_own = tl.dot(g_num, tl.trans(w_own), input_precision=PRECISION)
        g_own += a_s[:, None] * den_s_own[None, :] + a_o[:, None] * den_o_own[None, :]
        r = g_own * q_own  # g * f on the stream's entries
        acc_p += tl.sum(r * log_abs, axis=0)
        g_q = r * p[None, :] / tl.where(q == 0, 1., q)
        stored = mask & ((q < 0) == (sign == 1))  # q+ takes the zeros
        _store_block(gq_base, g_q, offs_n, offs_d, stride_gqn, stride_gqd, stored)

    part = (pid_bh * n_splits + pid_s).to(tl.int64)
    tl.store(GP + (part * 2 + sign) * d + offs_d, acc_p, mask=d_mask)


@_autotune('summary_backward')
@triton.jit
def summary_backward_kernel(Q, GO, W, P, EPS, KMAX, A, GW, stride_qb, stride_qh, stride_qn,
                            stride_qd, stride_gob, stride_goh, stride_gon, stride_god, H, N, d, d1,
                            rows_per_split, n_splits, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                            PRECISION: tl.constexpr, TINY: tl.constexpr):
    """Per (batch*head, split, stream): the partial gradient of the stream's rows of W,
    ``q_s^T (g / den)`` and the denominator columns. Takes the denominators' gradients of
    :func:`query_backward_rows_kernel` (A)."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    sign = tl.program_id(2)  # 0: q+, 1: q-
    own = 1. - 2. * sign.to(tl.float32)
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
                                                                eps, k_shift, own, offs_n, offs_d,
                                                                mask, rows, first, d, d_mask,
                                                                stride_qn, stride_qd, stride_gon,
                                                                stride_god, TINY)
        acc_w = tl.dot(tl.trans(q_own), g_num, acc_w, input_precision=PRECISION)
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
                          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                          TINY: tl.constexpr):
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
        phi = tl.exp(_log_abs(k, TINY) * p[None, :] - k_shift)
        g_kv_pos = _load_square(gkv_base, offs_d, d, d_mask)
        g_v = tl.dot(tl.where(k > 0, phi, 0.), g_kv_pos, input_precision=PRECISION)
        g_kv_neg = _load_square(gkv_base + d * d, offs_d, d, d_mask)
        g_v = tl.dot(tl.where(k < 0, phi, 0.), g_kv_neg, g_v, input_precision=PRECISION)
        _store_block(gv_base, g_v, offs_n, offs_d, stride_gvn, stride_gvd, mask)


@_autotune('key_backward')
@triton.jit
def key_backward_kernel(K, V, P, KMAX, GKV, GMEAN, GK, GP, stride_kb, stride_kh, stride_kn,
                        stride_kd, stride_vb, stride_vh, stride_vn, stride_vd, stride_gkb,
                        stride_gkh, stride_gkn, stride_gkd, H, n, d, rows_per_split, n_splits,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_J: tl.constexpr,
                        PRECISION: tl.constexpr, TINY: tl.constexpr):
    """Per (batch*head, split, stream and tile of BLOCK_J key channels): the gradient of k on
    the stream's entries (k >= 0 for k+, k < 0 for k-) from those of [k+, k-]^T v / n (GKV)
    and the key means, and the partial gradient of the exponent. A key channel's gradient
    needs only its own column of features, so the channels are tiled."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    sign = tl.program_id(2) % 2  # 0: k+, 1: k-
    own = 1. - 2. * sign.to(tl.float32)
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
        g_own = tl.dot(v, tl.trans(g_kv), input_precision=PRECISION) + g_mean[None, :]
        k = _load_block(k_base, offs_n, offs_j, stride_kn, stride_kd, mask)
        log_abs = _log_abs(k, TINY)
        k_own = tl.where(k * own > 0, tl.exp(log_abs * p[None, :] - k_shift), 0.)
        r = g_own * k_own
        acc_p += tl.sum(r * log_abs, axis=0)
        g_k = r * p[None, :] / tl.where(k == 0, 1., k)
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
