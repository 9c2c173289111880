"""The blocked autograd Function: the eager torch form of the op.

:func:`pola_linear_attention_blocked` runs :class:`_PolaAttentionFunction`, O((N + n) d^2),
which keeps only q, k, v, ``power``, the key summary ``W`` (:mod:`.key_summary`) and the key
shift for the backward pass and recomputes the polarity features there. Every pass over the
tokens runs block by block (:func:`token_blocks`), so that the feature planes of a block and
the temporaries of its element-wise maths stay in the CPU's caches. Blocks take the shared
shifts (:func:`~.shared_shifts.scaled_features`) unless their denominators say those lose
rows (:func:`~.shared_shifts.shared_shifts_lose_rows`); such blocks take the exact scheme
(:func:`_exact_block`, :mod:`.exact_scheme`) against a second key summary made only then.
The results are those of :func:`~.formulation.pola_linear_attention_plain` up to rounding.

Features as planes: ``[x+, x-]`` of x (..., m, d) are held as one tensor (2, ..., m, d),
plane 0 the positive and plane 1 the negative features; ``[x+, x-] @ W`` is then
``x+ @ W[:d] + x- @ W[d:]`` (:func:`_planes_matmul`).
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .checks import EpsType
from .exact_scheme import (absent_exponent, exact_eps, exact_key_features,
                           exact_key_features_for_backward, exact_query_features,
                           exact_query_features_for_backward, exact_shifts)
from .formulation import exp_floor, pola_exponent, value_split
from .key_summary import assemble_summary, summary_grads
from .shared_shifts import (scaled_eps, scaled_features, scaled_features_for_backward,
                            shared_shifts_lose_rows)

__all__ = ['pola_linear_attention_blocked', 'token_blocks', 'BLOCK_ELEMENTS']


def _as_matrix_batch(x: Tensor) -> Tensor:
    """(..., r, c) -> (prod(...), r, c), the operand layout of the batched matrix
    products (``baddbmm_``); a view where the strides allow."""
    return x.reshape((-1, ) + x.shape[-2:])


def _planes_matmul(x: Tensor, W: Tensor) -> Tensor:
    """``[x+, x-] @ W`` for features as planes (2, ..., m, d) and W (..., 2d, c)."""
    d = x.shape[-1]
    out = torch.matmul(x[0], W[..., :d, :])
    _as_matrix_batch(out).baddbmm_(_as_matrix_batch(x[1]), _as_matrix_batch(W[..., d:, :]))
    return out


def _planes_t_matmul(x: Tensor, y: Tensor) -> Tensor:
    """``[x+, x-]^T @ y`` (..., 2d, c) for features as planes and y (..., m, c)."""
    return torch.cat(
        [torch.matmul(x[0].transpose(-2, -1), y),
         torch.matmul(x[1].transpose(-2, -1), y)], dim=-2)


def _token_sum(x: Tensor) -> Tensor:
    """Sum of (B, h, N, d) over batch and tokens, (1, h, 1, d); over tokens first:
    one reduction over dims (0, 2) at once takes a strided path many times slower."""
    return x.sum(dim=2, keepdim=True).sum(dim=0, keepdim=True)


def _feature_grads(prod: Tensor, scaled: Tensor, inv_x: Tensor, p: Tensor, out: Tensor, g_p: Tensor,
                   g_log_scale: Optional[Tensor]) -> None:
    """The gradient of x (..., d) into ``out`` (any layout); those of the exponent p and,
    when ``g_log_scale`` is given, of ``log_scale`` added to ``g_p`` and ``g_log_scale``
    (1,h,1,d). ``prod``, ``scaled`` and ``inv_x`` are used as scratch space.

    ``prod`` (2, ...) is the gradient of the feature planes times the features. With
    f = (|x| / s)^p e^{-M} on the channel's own polarity (M held constant: the output
    does not depend on it), df/dx = p f sign(x) / |x|, df/dp = f log(|x| / s) and
    df/dlog(s) = -p f; all are 0 at x == 0, where f is 0.
    """
    r = prod[0].add_(prod[1])  # g f on the channel's own polarity
    if g_log_scale is not None:
        g_log_scale.sub_(_token_sum(r).mul_(p))
    torch.mul(inv_x, r, out=out).mul_(p)
    g_p.add_(_token_sum(r.mul_(scaled)).div_(p))  # sum r log(|x| / s)


def _output_like(q: Tensor) -> Tensor:
    """An empty (B, h, N, d) tensor in q's layout: heads inside tokens, (B, N, h, d) in
    memory, when q was split from (B, N, h*d) tokens (also when those were a slice of
    a wider projection, which ``empty_like`` would make contiguous), so that merging
    the heads back is a view; else ``empty_like``."""
    if q.dim() == 4 and q.stride(1) < q.stride(2):
        B, h, N, d = q.shape
        return q.new_empty(B, N, h, d).transpose(1, 2)
    return torch.empty_like(q)


#: Elements (B' * h * rows * d) of one feature plane per block of the torch path; inputs
#: of up to four times that run as one block (the loop's overhead outweighs the gain).
BLOCK_ELEMENTS = 1 << 18


def token_blocks(x: Tensor):
    """Blocks of (batch entries, tokens) of x (B, h, N, d) whose feature planes hold
    about ``BLOCK_ELEMENTS`` each: ranges of tokens of one batch entry when an entry
    is larger than that, else ranges of whole batch entries (e.g. Swin windows); one
    block for small inputs and off the CPU (a GPU wants few large kernels). Yields
    (batch slice, token slice)."""
    B, h, N, d = x.shape
    per_entry = h * N * d
    if B * per_entry == 0:
        return  # no block: nothing to compute
    if x.device.type != 'cpu' or B * per_entry <= 4 * BLOCK_ELEMENTS:
        yield slice(0, B), slice(0, N)
    elif per_entry > BLOCK_ELEMENTS:
        rows = -(-N // -(-per_entry // BLOCK_ELEMENTS))  # equal blocks of <= the size
        for b in range(B):
            for t in range(0, N, rows):
                yield slice(b, b + 1), slice(t, min(t + rows, N))
    else:
        step = BLOCK_ELEMENTS // per_entry
        for b in range(0, B, step):
            yield slice(b, min(b + step, B)), slice(0, N)


def _key_shift(shifts: Tensor) -> Tensor:
    """``M_k`` (B,h,1,1): max(0, the largest p (log max(|k|, tiny) - log_scale) of the
    (batch, head)), the largest of its channels' and signs' ``shifts``
    (:func:`exact_shifts`; log and the products with p > 0 preserve the order)."""
    return shifts.amax(dim=-1, keepdim=True).amax(dim=0).clamp_min_(0)


def _divide_by_denominators(qf: Tensor, shift_q: Tensor, W: Tensor, eps: EpsType,
                            shift_k: Tensor) -> Tuple[Tensor, Tensor]:
    """``num_den = Q W`` (B', h, rows, d + 2) for the query feature planes ``qf`` and
    their row shifts: the d numerators, then the two denominators, whose columns are
    turned into their reciprocals (``inv_den``, also returned as that view) with the
    scaled eps (:func:`~.shared_shifts.scaled_eps`) added first."""
    num_den = _planes_matmul(qf, W)
    d = W.shape[-1] - 2
    inv_den = num_den[..., d:].add_(scaled_eps(eps, shift_q, shift_k)).reciprocal_()
    return num_den, inv_den


def _query_block(q: Tensor, p: Tensor, W: Tensor, eps: EpsType, shift_k: Tensor,
                 log_scale: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """For a block of queries q (B', h, rows, d) and its entries' summary W, eps
    (a float or broadcastable to (B', h, 1, 1)) and key shift, with the shared shifts:
    ``(num_den, inv_den)`` of :func:`_divide_by_denominators`."""
    qf, shift_q = scaled_features(q, p, per_row=True, log_scale=log_scale)
    return _divide_by_denominators(qf, shift_q, W, eps, shift_k)


def _eps_rows(eps: EpsType, batch: slice, entries: Tuple[int, int]) -> EpsType:
    """The eps of the batch entries ``batch``: a float as it is, a tensor broadcastable
    to (B, h, 1, 1) (``entries`` = (B, h)) expanded to that and sliced."""
    return eps.expand(*entries, 1, 1)[batch] if isinstance(eps, Tensor) else eps


# --------------------------------------------------------------------------------------
# the exact scheme, for the blocks the shared shifts cannot carry
# --------------------------------------------------------------------------------------


def _stream_columns(W: Tensor) -> List[Tensor]:
    """The columns of W (..., 2d, d + 2) each stream uses: its numerators, then its
    denominator (same-signed: ``:ceil(d/2)`` and ``d``; opposite: the rest and
    ``d + 1``)."""
    d = W.shape[-1] - 2
    d1 = value_split(d)
    return [
        torch.cat([W[..., :d1], W[..., d:d + 1]], dim=-1),
        torch.cat([W[..., d1:d], W[..., d + 1:]], dim=-1)
    ]


def _exact_block(q: Tensor,
                 p: Tensor,
                 W: Tensor,
                 shifts: Tensor,
                 eps: EpsType,
                 log_scale: Optional[Tensor],
                 out: Optional[Tensor] = None,
                 grad_out: Optional[Tensor] = None,
                 g_q: Optional[Tensor] = None,
                 g_W: Optional[Tensor] = None,
                 g_p: Optional[Tensor] = None,
                 g_log_scale: Optional[Tensor] = None) -> None:
    """A block of queries (B', h, rows, d) in the exact scheme, against the exact
    summary ``W`` (made of
    :func:`~.exact_scheme.exact_key_features`) and its ``shifts``: the output
    into ``out``, or, given ``grad_out``, the backward pass: the gradient of q into
    ``g_q``, those of W, p and ``log_scale`` added to ``g_W``, ``g_p`` and
    ``g_log_scale``. Per stream as the shared scheme's blocks do for both at once."""
    d = q.shape[-1]
    d1 = value_split(d)
    backward = grad_out is not None
    if backward:
        streams, scaled, inv_x = exact_query_features_for_backward(q, p, shifts, log_scale)
    else:
        streams = exact_query_features(q, p, shifts, log_scale)
    prod = None
    for stream, ((planes, shift), W_s) in enumerate(zip(streams, _stream_columns(W))):
        width = W_s.shape[-1] - 1
        # (..., rows, width + 1): the stream's numerators, then its denominator
        num_den = _planes_matmul(planes, W_s)
        inv_den = num_den[..., width:].add_(exact_eps(eps, shift)).reciprocal_()
        columns = slice(0, d1) if stream == 0 else slice(d1, d)
        if not backward:
            torch.mul(num_den[..., :width], inv_den, out=out[..., columns])
            continue
        # out = num z (z = 1 / den): dL/dnum = g z, dL/dden = -z sum(g z num)
        g_num_den = num_den.new_empty(num_den.shape)
        torch.mul(grad_out[..., columns], inv_den, out=g_num_den[..., :width])
        g_num = num_den[..., :width].mul_(g_num_den[..., :width])
        torch.sum(g_num, dim=-1, keepdim=True, out=g_num_den[..., width:])
        g_num_den[..., width:].mul_(inv_den).neg_()
        del g_num, num_den, inv_den
        g_W_s = _planes_t_matmul(planes, g_num_den)
        g_W[..., columns] += g_W_s[..., :width]
        g_W[..., d + stream] += g_W_s[..., width]
        for j in range(2):
            planes[j].mul_(
                torch.matmul(g_num_den, W_s[..., j * d:(j + 1) * d, :].transpose(-2, -1)))
        prod = planes if prod is None else prod.add_(planes)
    if backward:
        _feature_grads(prod, scaled, inv_x, p, g_q, g_p, g_log_scale)


def _key_summary(k: Tensor, v: Tensor, features) -> Tensor:
    """W (B, h, 2d, d + 2) from the key feature planes ``features(bs, ts)`` of each block
    of k (:func:`token_blocks`): ``[k+, k-]^T v / n`` and the feature means."""
    B, h, n, d = k.shape
    kv = k.new_zeros((B, h, 2 * d, d))
    k_sum = k.new_zeros((B, h, 2 * d))
    for bs, ts in token_blocks(k):
        kf = features(bs, ts)
        kv[bs] += _planes_t_matmul(kf, v[bs, :, ts])
        k_sum[bs] += kf.sum(dim=-2).permute(1, 2, 0, 3).flatten(-2)
    return assemble_summary(kv.div_(n), k_sum.div_(n))


def _key_grads(k: Tensor, v: Tensor, p: Tensor, g_W: Tensor, features, g_k: Tensor, g_v: Tensor,
               g_p: Tensor, g_log_scale: Optional[Tensor], accumulate: bool) -> None:
    """The gradients of k and v from that of W (made by :func:`_key_summary` of the
    same ``features(bs, ts)``, which here returns the planes with ``scaled`` and
    ``inv_x``), written into (or with ``accumulate`` added to) ``g_k`` and ``g_v``;
    those of p and ``log_scale`` added to ``g_p`` and ``g_log_scale``."""
    d, n = k.shape[-1], k.shape[-2]
    g_kv, g_mean = summary_grads(g_W, d)
    g_kv.div_(n)
    g_mean.div_(n)
    for bs, ts in token_blocks(k):
        g_kv_b, g_mean_b, v_b = g_kv[bs], g_mean[bs], v[bs, :, ts]
        kf, scaled, inv_x = features(bs, ts)
        g_v_b = _planes_matmul(kf, g_kv_b)
        if accumulate:
            g_v[bs, :, ts] += g_v_b
        else:
            g_v[bs, :, ts] = g_v_b
        del g_v_b
        for i in range(2):
            rows = slice(i * d, (i + 1) * d)
            g_feat = torch.matmul(v_b, g_kv_b[..., rows, :].transpose(-2, -1))
            kf[i].mul_(g_feat.add_(g_mean_b[..., None, rows]))
        del g_feat
        if accumulate:
            g_k_b = torch.empty_like(scaled)
            _feature_grads(kf, scaled, inv_x, p, g_k_b, g_p, g_log_scale)
            g_k[bs, :, ts] += g_k_b
        else:
            _feature_grads(kf, scaled, inv_x, p, g_k[bs, :, ts], g_p, g_log_scale)
        del kf, scaled, inv_x


class _PolaAttentionFunction(torch.autograd.Function):
    """The torch path: O((N + n) d^2), features recomputed in the backward pass.

    Every pass over the tokens runs block by block (:func:`token_blocks`): the feature
    planes of a block and the temporaries of its element-wise maths stay in the CPU's
    caches between the operations that make and use them, instead of making one trip
    to main memory per operation over all N tokens, and nothing of size N x d is
    allocated but the results.

    Two schemes of shifts. The shared one (every query row by its largest feature,
    all keys of a (batch, head) by theirs) serves every block whose denominators stay
    above ``tiny * 2**50`` (:func:`~.shared_shifts.shared_shifts_lose_rows`):
    for moderate inputs and exponents, all of them. A block below that (large
    ``alpha``, magnitudes far apart) is computed with the exact scheme of
    :func:`_exact_block` instead, against a second key summary made only then, and so
    are the blocks after it; keys that the shared shifts cannot carry at all
    (:func:`beyond_shared_shifts`) send every block there at once. The backward pass
    takes each block the way the forward pass took it.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, eps: EpsType,
                scale: Optional[Tensor]) -> Tensor:
        B, h, _, d = q.shape
        d1 = value_split(d)
        p = pola_exponent(power, alpha)
        log_scale = None if scale is None else scale.log()

        # Keys: [k+, k-]^T v and the feature sums, block by block, with the shared
        # shifts unless some channel and sign of keys lies wholly under their floor.
        shifts = exact_shifts(k, p, log_scale)
        shift_k = _key_shift(shifts)
        W_x = None  # the exact scheme's summary, made when a block first needs it
        if beyond_shared_shifts(shifts, shift_k):
            W = shift_k.new_zeros(0)
            W_x = _exact_summary(k, v, p, shifts, log_scale)
        else:
            W = _key_summary(
                k, v, lambda bs, ts: scaled_features(
                    k[bs, :, ts], p, per_row=False, shift=shift_k[bs], log_scale=log_scale)[0])

        out = _output_like(q)
        exact_blocks = []
        for i, (bs, ts) in enumerate(token_blocks(q)):
            eps_b = _eps_rows(eps, bs, (B, h))
            out_b = out[bs, :, ts]
            if W_x is None:  # the shared shifts, while every block so far kept its rows
                num_den, inv_den = _query_block(q[bs, :, ts], p, W[bs], eps_b, shift_k[bs],
                                                log_scale)
                if not shared_shifts_lose_rows(inv_den):
                    torch.mul(num_den[..., :d1], inv_den[..., :1], out=out_b[..., :d1])
                    torch.mul(num_den[..., d1:d], inv_den[..., 1:], out=out_b[..., d1:])
                    continue
                del num_den, inv_den
                W_x = _exact_summary(k, v, p, shifts, log_scale)
            _exact_block(q[bs, :, ts], p, W_x[bs], shifts[:, bs], eps_b, log_scale, out=out_b)
            exact_blocks.append(i)
        ctx.alpha = alpha
        ctx.eps_is_tensor = isinstance(eps, Tensor)
        ctx.has_scale = scale is not None
        ctx.exact_blocks = exact_blocks
        saved = [q, k, v, power, W, shift_k]
        if exact_blocks:
            saved += [W_x, shifts]
        if ctx.has_scale:
            saved.append(scale)
        if ctx.eps_is_tensor:
            saved.append(eps)
        else:
            ctx.eps = eps
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        with torch.autocast(grad_out.device.type, enabled=False):
            return _PolaAttentionFunction._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out: Tensor):
        saved = list(ctx.saved_tensors)
        eps = saved.pop() if ctx.eps_is_tensor else ctx.eps
        scale = saved.pop() if ctx.has_scale else None
        q, k, v, power, W, shift_k = saved[:6]
        W_x, shifts = saved[6:] if ctx.exact_blocks else (None, None)
        log_scale = None if scale is None else scale.log()
        alpha, has_scale = ctx.alpha, ctx.has_scale
        exact_blocks = set(ctx.exact_blocks)
        B, h, _, d = q.shape
        p = pola_exponent(power, alpha)
        grad_out = grad_out.to(q.dtype)
        g_p = torch.zeros_like(p)
        g_log_scale = torch.zeros_like(p) if has_scale else None

        # Queries, block by block: recompute num and the denominators. out_c = num_c z
        # (z = 1 / the denominator of c's stream): dL/dnum_c = g_c z,
        # dL/dden = -z sum_c (g_c z) num_c.
        g_q = _output_like(q)
        g_W = torch.zeros_like(W)
        g_W_x = None if W_x is None else torch.zeros_like(W_x)
        shared_blocks = 0
        for i, (bs, ts) in enumerate(token_blocks(q)):
            eps_b = _eps_rows(eps, bs, (B, h))
            if i in exact_blocks:
                _exact_block(
                    q[bs, :, ts],
                    p,
                    W_x[bs],
                    shifts[:, bs],
                    eps_b,
                    log_scale,
                    grad_out=grad_out[bs, :, ts],
                    g_q=g_q[bs, :, ts],
                    g_W=g_W_x[bs],
                    g_p=g_p,
                    g_log_scale=g_log_scale)
                continue
            shared_blocks += 1
            _shared_block_grads(q[bs, :, ts], p, W[bs], eps_b, shift_k[bs], log_scale,
                                grad_out[bs, :, ts], g_q[bs, :, ts], g_W[bs], g_p, g_log_scale)

        # Keys, block by block: W holds [k+, k-]^T v / n and the key means, of the
        # shared shifts (shared blocks) and of the exact ones (exact blocks).
        g_k, g_v = _output_like(k), _output_like(v)
        if not shared_blocks and not exact_blocks:  # no query: the keys get 0
            g_k.zero_()
            g_v.zero_()
        if shared_blocks:

            def shared(bs, ts):
                kf, _, scaled, inv_x = scaled_features_for_backward(
                    k[bs, :, ts], p, per_row=False, shift=shift_k[bs], log_scale=log_scale)
                return kf, scaled, inv_x

            _key_grads(k, v, p, g_W, shared, g_k, g_v, g_p, g_log_scale, accumulate=False)
        if exact_blocks:
            _key_grads(
                k,
                v,
                p,
                g_W_x,
                lambda bs, ts: exact_key_features_for_backward(k[bs, :, ts], p, shifts[:, bs],
                                                               log_scale),
                g_k,
                g_v,
                g_p,
                g_log_scale,
                accumulate=shared_blocks > 0)
        s = torch.sigmoid(power)
        g_power = g_p.mul_(s * (1 - s) * alpha)
        g_scale = None
        if has_scale:
            g_scale = g_log_scale.div_(scale)
        return g_q, g_k, g_v, g_power, None, None, g_scale


def _shared_block_grads(q: Tensor, p: Tensor, W: Tensor, eps: EpsType, shift_k: Tensor,
                        log_scale: Optional[Tensor], grad_out: Tensor, g_q: Tensor, g_W: Tensor,
                        g_p: Tensor, g_log_scale: Optional[Tensor]) -> None:
    """The backward pass of one block of queries taken with the shared shifts: recompute
    num and the denominators; out_c = num_c z (z = 1 / the denominator of c's stream):
    dL/dnum_c = g_c z, dL/dden = -z sum_c (g_c z) num_c. Writes the queries' gradient
    into ``g_q`` and adds to ``g_W`` (the key summary's), ``g_p`` and ``g_log_scale``."""
    d = q.shape[-1]
    d1 = value_split(d)
    qf, shift_q, scaled, inv_x = scaled_features_for_backward(
        q, p, per_row=True, log_scale=log_scale)
    num_den, inv_den = _divide_by_denominators(qf, shift_q, W, eps, shift_k)
    g_num_den = num_den.new_empty(num_den.shape)  # [g z, dL/dden_sim, dL/dden_opp]
    torch.mul(grad_out[..., :d1], inv_den[..., :1], out=g_num_den[..., :d1])
    torch.mul(grad_out[..., d1:], inv_den[..., 1:], out=g_num_den[..., d1:d])
    g_num = num_den[..., :d].mul_(g_num_den[..., :d])
    torch.sum(g_num[..., :d1], dim=-1, keepdim=True, out=g_num_den[..., d:d + 1])
    torch.sum(g_num[..., d1:], dim=-1, keepdim=True, out=g_num_den[..., d + 1:])
    g_num_den[..., d:].mul_(inv_den).neg_()
    del g_num, inv_den, num_den
    g_W += _planes_t_matmul(qf, g_num_den)
    for j in range(2):
        qf[j].mul_(torch.matmul(g_num_den, W[..., j * d:(j + 1) * d, :].transpose(-2, -1)))
    del g_num_den
    _feature_grads(qf, scaled, inv_x, p, g_q, g_p, g_log_scale)


def _exact_summary(k: Tensor, v: Tensor, p: Tensor, shifts: Tensor,
                   log_scale: Optional[Tensor]) -> Tensor:
    """The key summary of the exact scheme, of its ``shifts`` (:func:`exact_shifts`)."""
    return _key_summary(
        k, v, lambda bs, ts: exact_key_features(k[bs, :, ts], p, shifts[:, bs], log_scale))


def beyond_shared_shifts(shifts: Tensor, shift_k: Tensor) -> bool:
    """Whether the largest key feature of some channel and sign (``shifts``) lies under
    the shared shifts' floor (:func:`exp_floor`) below its (batch, head)'s ``M_k``: all
    its features would be floored, and the rows that meet them lost. Then every block
    takes the exact scheme at once (its test would only fail block after block, each
    after a pass whose floored products run the slow path of the CPU's matrix
    products)."""
    present = shifts > -absent_exponent(shifts.dtype) / 2
    return bool((present & (shifts - shift_k < exp_floor(shifts.dtype))).any())


def pola_linear_attention_blocked(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float,
                                  eps: EpsType, scale: Optional[Tensor]) -> Tensor:
    """:class:`_PolaAttentionFunction` for checked arguments of one floating dtype
    (those of :func:`~.formulation.pola_linear_attention_plain`), with eps, power and
    scale taken to q's dtype and device. Returns (B, h, N, d) in q's memory layout."""
    if isinstance(eps, Tensor):
        eps = eps.to(device=q.device, dtype=q.dtype)
    power = power.to(q.dtype)
    if scale is not None:
        scale = scale.to(q.dtype)
    return _PolaAttentionFunction.apply(q, k, v, power, alpha, eps, scale)
