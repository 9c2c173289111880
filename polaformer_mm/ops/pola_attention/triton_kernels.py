"""Triton kernels of the fused polarity-aware linear attention.

Imported by :mod:`polaformer_mm.ops.pola_attention.triton_backend` (and the tests), and only when
Triton is installed. All arithmetic is float32 whatever the storage dtype. Notation as in
:mod:`polaformer_mm.ops.pola_attention.formulation`: ``W`` (2d x (d+2)) is the key summary (rows
0..d-1 multiply q+, rows d..2d-1 multiply q-; columns: d numerators, then the
denominators of the same-signed and the opposite stream). A feature is
``exp(p log max(|x|, tiny) - M)`` masked by the sign of x, so exact zeros give zero
features and never raise the shift ``M`` (which is at least 0).
"""
import os

import triton
import triton.language as tl

#: Launch configurations tried once per head width and storage dtype on the GPU (the
#: fastest wins; ones that do not fit the GPU's shared memory are skipped). The first
#: is the one the interpreter runs.
CONFIGS = [
    triton.Config({'BLOCK_N': 64}, num_warps=4, num_stages=2),
    triton.Config({'BLOCK_N': 64}, num_warps=8, num_stages=2),
    triton.Config({'BLOCK_N': 32}, num_warps=4, num_stages=2),
    triton.Config({'BLOCK_N': 32}, num_warps=4, num_stages=1),
]


def _autotune(fn):
    # Triton's interpreter (TRITON_INTERPRET=1, read before Triton is imported) runs one
    # configuration: the autotuner times its configurations through the GPU driver, which the
    # interpreter may not have (Triton 3.7 asks for it even for a single pruned configuration).
    interpreting = os.environ.get('TRITON_INTERPRET', '0') == '1'
    return triton.autotune(configs=CONFIGS[:1] if interpreting else CONFIGS, key=['d'])(fn)


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
def _load_summary(W, offs_d, d, d_mask):
    """The blocks of W (2d, d+2) that q+ and q- multiply."""
    w_mask = d_mask[:, None] & d_mask[None, :]
    row_pos = offs_d[:, None] * (d + 2)
    row_neg = (d + offs_d[:, None]) * (d + 2)
    w_pos = tl.load(W + row_pos + offs_d[None, :], mask=w_mask, other=0.)
    w_neg = tl.load(W + row_neg + offs_d[None, :], mask=w_mask, other=0.)
    den_s_pos = tl.load(W + offs_d * (d + 2) + d, mask=d_mask, other=0.)
    den_s_neg = tl.load(W + (d + offs_d) * (d + 2) + d, mask=d_mask, other=0.)
    den_o_pos = tl.load(W + offs_d * (d + 2) + d + 1, mask=d_mask, other=0.)
    den_o_neg = tl.load(W + (d + offs_d) * (d + 2) + d + 1, mask=d_mask, other=0.)
    return w_pos, w_neg, den_s_pos, den_s_neg, den_o_pos, den_o_neg


@_autotune
@triton.jit
def key_summary_kernel(K, V, P, KV, KMEAN, KMAX, stride_kb, stride_kh, stride_kn, stride_kd,
                       stride_vb, stride_vh, stride_vn, stride_vd, H, n, d, rows_per_split,
                       n_splits, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       PRECISION: tl.constexpr, TINY: tl.constexpr):
    """Per (batch*head, split): [k+, k-]^T v, the feature sums and the shift used.

    Within a split the shift is the running max of p log|k| (at least 0); the
    accumulators are rescaled when it grows. The caller rescales the splits to their
    common max and adds them.
    """
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    hh = pid_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < d
    p = tl.load(P + hh * d + offs_d, mask=d_mask, other=1.)
    k_base = K + b * stride_kb + hh * stride_kh
    v_base = V + b * stride_vb + hh * stride_vh

    acc_pos = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
    acc_neg = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
    sum_pos = tl.zeros([BLOCK_D], dtype=tl.float32)
    sum_neg = tl.zeros([BLOCK_D], dtype=tl.float32)
    shift = tl.max(tl.zeros([BLOCK_D], dtype=tl.float32), axis=0)
    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, n)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask = (offs_n < end)[:, None] & d_mask[None, :]
        k = _load_block(k_base, offs_n, offs_d, stride_kn, stride_kd, mask)
        v = _load_block(v_base, offs_n, offs_d, stride_vn, stride_vd, mask)
        scaled = _log_abs(k, TINY) * p[None, :]
        new_shift = tl.maximum(shift, tl.max(scaled))
        rescale = tl.exp(shift - new_shift)
        phi = tl.exp(scaled - new_shift)
        k_pos = tl.where(k > 0, phi, 0.)
        k_neg = tl.where(k < 0, phi, 0.)
        acc_pos = tl.dot(tl.trans(k_pos), v, acc_pos * rescale, input_precision=PRECISION)
        acc_neg = tl.dot(tl.trans(k_neg), v, acc_neg * rescale, input_precision=PRECISION)
        sum_pos = sum_pos * rescale + tl.sum(k_pos, axis=0)
        sum_neg = sum_neg * rescale + tl.sum(k_neg, axis=0)
        shift = new_shift

    part = (pid_bh * n_splits + pid_s).to(tl.int64)
    kv_mask = d_mask[:, None] & d_mask[None, :]
    kv_base = KV + part * (2 * d * d)
    tl.store(kv_base + offs_d[:, None] * d + offs_d[None, :], acc_pos, mask=kv_mask)
    tl.store(kv_base + (d + offs_d[:, None]) * d + offs_d[None, :], acc_neg, mask=kv_mask)
    tl.store(KMEAN + part * (2 * d) + offs_d, sum_pos, mask=d_mask)
    tl.store(KMEAN + part * (2 * d) + d + offs_d, sum_neg, mask=d_mask)
    tl.store(KMAX + part, shift)


@triton.jit
def _query_features(q, p, TINY: tl.constexpr):
    log_abs = _log_abs(q, TINY)
    scaled = log_abs * p[None, :]
    shift = tl.maximum(tl.max(scaled, axis=1), 0.)
    phi = tl.exp(scaled - shift[:, None])
    return tl.where(q > 0, phi, 0.), tl.where(q < 0, phi, 0.), shift, log_abs


@_autotune
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
    w_pos, w_neg, den_s_pos, den_s_neg, den_o_pos, den_o_neg = _load_summary(
        W + pid_bh.to(tl.int64) * (2 * d * (d + 2)), offs_d, d, d_mask)
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
        num = tl.dot(q_pos, w_pos, input_precision=PRECISION)
        num = tl.dot(q_neg, w_neg, num, input_precision=PRECISION)
        den_s = tl.sum(q_pos * den_s_pos[None, :] + q_neg * den_s_neg[None, :], axis=1)
        den_o = tl.sum(q_pos * den_o_pos[None, :] + q_neg * den_o_neg[None, :], axis=1)
        eps_scaled = _scaled_eps(eps, shift, k_shift, TINY)
        inv_s = 1. / (den_s + eps_scaled)
        inv_o = 1. / (den_o + eps_scaled)
        block_largest = tl.max(tl.where(rows, tl.maximum(inv_s, inv_o), 0.), axis=0)
        largest_inv_den = tl.maximum(largest_inv_den, block_largest)
        out = num * tl.where(first, inv_s[:, None], inv_o[:, None])
        _store_block(out_base, out, offs_n, offs_d, stride_on, stride_od, mask)
    tl.store(LARGEST_INV_DEN + pid_bh * n_splits + pid_s, largest_inv_den)


@_autotune
@triton.jit
def query_backward_kernel(Q, GO, W, P, EPS, KMAX, GQ, GW, GP, stride_qb, stride_qh, stride_qn,
                          stride_qd, stride_gob, stride_goh, stride_gon, stride_god, stride_gqb,
                          stride_gqh, stride_gqn, stride_gqd, H, N, d, d1, rows_per_split, n_splits,
                          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                          TINY: tl.constexpr):
    """Gradient of q, and per split the partial gradients of W and of the exponent."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    hh = pid_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < d
    first = offs_d[None, :] < d1
    p = tl.load(P + hh * d + offs_d, mask=d_mask, other=1.)
    w_pos, w_neg, den_s_pos, den_s_neg, den_o_pos, den_o_neg = _load_summary(
        W + pid_bh.to(tl.int64) * (2 * d * (d + 2)), offs_d, d, d_mask)
    eps = tl.load(EPS + pid_bh)
    k_shift = tl.load(KMAX + pid_bh)
    q_base = Q + b * stride_qb + hh * stride_qh
    go_base = GO + b * stride_gob + hh * stride_goh
    gq_base = GQ + b * stride_gqb + hh * stride_gqh

    acc_w_pos = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
    acc_w_neg = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
    acc_s_pos = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc_s_neg = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc_o_pos = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc_o_neg = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc_p = tl.zeros([BLOCK_D], dtype=tl.float32)
    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, N)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask = (offs_n < end)[:, None] & d_mask[None, :]
        q = _load_block(q_base, offs_n, offs_d, stride_qn, stride_qd, mask)
        go = _load_block(go_base, offs_n, offs_d, stride_gon, stride_god, mask)
        q_pos, q_neg, shift, log_abs = _query_features(q, p, TINY)
        num = tl.dot(q_pos, w_pos, input_precision=PRECISION)
        num = tl.dot(q_neg, w_neg, num, input_precision=PRECISION)
        den_s = tl.sum(q_pos * den_s_pos[None, :] + q_neg * den_s_neg[None, :], axis=1)
        den_o = tl.sum(q_pos * den_o_pos[None, :] + q_neg * den_o_neg[None, :], axis=1)
        eps_scaled = _scaled_eps(eps, shift, k_shift, TINY)
        inv_s = 1. / (den_s + eps_scaled)
        inv_o = 1. / (den_o + eps_scaled)
        inv = tl.where(first, inv_s[:, None], inv_o[:, None])
        g_num = go * inv
        go_out = g_num * num  # g_c * out_c
        a_s = -inv_s * tl.sum(tl.where(first, go_out, 0.), axis=1)
        a_o = -inv_o * tl.sum(tl.where(first, 0., go_out), axis=1)
        g_pos = tl.dot(g_num, tl.trans(w_pos), input_precision=PRECISION)
        g_pos += a_s[:, None] * den_s_pos[None, :] + a_o[:, None] * den_o_pos[None, :]
        g_neg = tl.dot(g_num, tl.trans(w_neg), input_precision=PRECISION)
        g_neg += a_s[:, None] * den_s_neg[None, :] + a_o[:, None] * den_o_neg[None, :]
        acc_w_pos = tl.dot(tl.trans(q_pos), g_num, acc_w_pos, input_precision=PRECISION)
        acc_w_neg = tl.dot(tl.trans(q_neg), g_num, acc_w_neg, input_precision=PRECISION)
        acc_s_pos += tl.sum(q_pos * a_s[:, None], axis=0)
        acc_s_neg += tl.sum(q_neg * a_s[:, None], axis=0)
        acc_o_pos += tl.sum(q_pos * a_o[:, None], axis=0)
        acc_o_neg += tl.sum(q_neg * a_o[:, None], axis=0)
        r = g_pos * q_pos + g_neg * q_neg  # g * f on the channel's own polarity
        acc_p += tl.sum(r * log_abs, axis=0)
        g_q = r * p[None, :] / tl.where(q == 0, 1., q)
        _store_block(gq_base, g_q, offs_n, offs_d, stride_gqn, stride_gqd, mask)

    part = (pid_bh * n_splits + pid_s).to(tl.int64)
    gw_base = GW + part * (2 * d * (d + 2))
    w_mask = d_mask[:, None] & d_mask[None, :]
    tl.store(gw_base + offs_d[:, None] * (d + 2) + offs_d[None, :], acc_w_pos, mask=w_mask)
    tl.store(gw_base + (d + offs_d[:, None]) * (d + 2) + offs_d[None, :], acc_w_neg, mask=w_mask)
    tl.store(gw_base + offs_d * (d + 2) + d, acc_s_pos, mask=d_mask)
    tl.store(gw_base + (d + offs_d) * (d + 2) + d, acc_s_neg, mask=d_mask)
    tl.store(gw_base + offs_d * (d + 2) + d + 1, acc_o_pos, mask=d_mask)
    tl.store(gw_base + (d + offs_d) * (d + 2) + d + 1, acc_o_neg, mask=d_mask)
    tl.store(GP + part * d + offs_d, acc_p, mask=d_mask)


@_autotune
@triton.jit
def key_backward_kernel(K, V, P, KMAX, GKV, GMEAN, GK, GV, GP, stride_kb, stride_kh, stride_kn,
                        stride_kd, stride_vb, stride_vh, stride_vn, stride_vd, stride_gkb,
                        stride_gkh, stride_gkn, stride_gkd, stride_gvb, stride_gvh, stride_gvn,
                        stride_gvd, H, n, d, rows_per_split, n_splits, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, TINY: tl.constexpr):
    """Gradients of k and v from those of [k+, k-]^T v / n (GKV) and the key means."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    hh = pid_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < d
    p = tl.load(P + hh * d + offs_d, mask=d_mask, other=1.)
    k_shift = tl.load(KMAX + pid_bh)
    gkv_base = GKV + pid_bh.to(tl.int64) * (2 * d * d)
    g_mask = d_mask[:, None] & d_mask[None, :]
    g_kv_pos = tl.load(gkv_base + offs_d[:, None] * d + offs_d[None, :], mask=g_mask, other=0.)
    g_kv_neg = tl.load(
        gkv_base + (d + offs_d[:, None]) * d + offs_d[None, :], mask=g_mask, other=0.)
    gmean_base = GMEAN + pid_bh.to(tl.int64) * (2 * d)
    g_mean_pos = tl.load(gmean_base + offs_d, mask=d_mask, other=0.)
    g_mean_neg = tl.load(gmean_base + d + offs_d, mask=d_mask, other=0.)
    k_base = K + b * stride_kb + hh * stride_kh
    v_base = V + b * stride_vb + hh * stride_vh
    gk_base = GK + b * stride_gkb + hh * stride_gkh
    gv_base = GV + b * stride_gvb + hh * stride_gvh

    acc_p = tl.zeros([BLOCK_D], dtype=tl.float32)
    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, n)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask = (offs_n < end)[:, None] & d_mask[None, :]
        k = _load_block(k_base, offs_n, offs_d, stride_kn, stride_kd, mask)
        v = _load_block(v_base, offs_n, offs_d, stride_vn, stride_vd, mask)
        log_abs = _log_abs(k, TINY)
        phi = tl.exp(log_abs * p[None, :] - k_shift)
        k_pos = tl.where(k > 0, phi, 0.)
        k_neg = tl.where(k < 0, phi, 0.)
        g_v = tl.dot(k_pos, g_kv_pos, input_precision=PRECISION)
        g_v = tl.dot(k_neg, g_kv_neg, g_v, input_precision=PRECISION)
        _store_block(gv_base, g_v, offs_n, offs_d, stride_gvn, stride_gvd, mask)
        g_pos = tl.dot(v, tl.trans(g_kv_pos), input_precision=PRECISION)
        g_pos += g_mean_pos[None, :]
        g_neg = tl.dot(v, tl.trans(g_kv_neg), input_precision=PRECISION)
        g_neg += g_mean_neg[None, :]
        r = g_pos * k_pos + g_neg * k_neg
        acc_p += tl.sum(r * log_abs, axis=0)
        g_k = r * p[None, :] / tl.where(k == 0, 1., k)
        _store_block(gk_base, g_k, offs_n, offs_d, stride_gkn, stride_gkd, mask)

    part = (pid_bh * n_splits + pid_s).to(tl.int64)
    tl.store(GP + part * d + offs_d, acc_p, mask=d_mask)
