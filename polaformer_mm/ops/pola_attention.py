r"""Polarity-aware linear attention (PolaFormer) as functions.

Inputs are split into heads, ``q`` (B, h, N, d), ``k`` and ``v`` (B, h, n, d), with q and k
already divided by ``softplus(scale)`` or that divisor given as ``scale=`` (folded into the
features by :func:`pola_linear_attention`). ``power`` is the raw learned (1, h, 1, d) parameter; the
exponent of channel j is :math:`p_j = 1 + \alpha\,\sigma(\text{power}_j) > 1`.

The maths. The polarity features of a vector x are :math:`x^+ = \text{relu}(x)^p` and
:math:`x^- = \text{relu}(-x)^p` (element-wise, exponent per channel). For query i and key t
the same-signed score is :math:`s_{it} = q_i^+ \cdot k_t^+ + q_i^- \cdot k_t^-` and the
opposite-signed score :math:`o_{it} = q_i^- \cdot k_t^+ + q_i^+ \cdot k_t^-`. With the values
split as ``torch.chunk(v, 2, -1)`` does (``v1``: the first ``ceil(d/2)`` channels, ``v2``:
the rest) the output of query i is

.. math::

    \text{out}_i = \Big[\frac{\sum_t s_{it} v1_t}{\sum_t s_{it} + n\,\epsilon},\;
                        \frac{\sum_t o_{it} v2_t}{\sum_t o_{it} + n\,\epsilon}\Big]

(B, h, N, d). Three implementations of this one formula:

* :func:`pola_linear_attention`, the one to use. Both streams are products of
  :math:`Q = [q^+, q^-]` (N x 2d) with one (2d x (d + 2)) summary ``W`` of the keys
  (the key-value sums :math:`[k^+, k^-]^\top v / n` with their rows rearranged per stream,
  and the two key means), so it costs O((N + n) d^2) and never forms an N x n matrix. It is
  a :class:`torch.autograd.Function` that keeps only q, k, v, ``power``, ``W`` and one
  number per (batch, head) for the backward pass, and recomputes the polarity features
  there. On CUDA with Triton installed a fused kernel does the same
  (:mod:`polaformer_mm.ops.pola_attention_triton`); ``backend`` chooses. Under a graph
  capture (a jit trace, an ONNX export with either exporter, ``torch.compile`` or
  ``torch.export``) the torch path takes a plain tensor formulation of the same
  computation instead (the same features, shifts and scaled ``eps``; out-of-place
  operations, no autograd Function, no blocks), which the captured graph records whole
  for any token count; a trace or an export takes it on CUDA too, in place of the
  Triton kernel.
* :func:`pola_linear_attention_naive`: the order of operations of the official code
  (``relu(x) ** p`` and ``relu(-x) ** p`` separately, each stream its own ``K^T v`` and
  normaliser, autograd through all of it). Benchmarks compare against it.
* :func:`pola_linear_attention_reference`: the explicit N x n weights of both streams,
  which is what the method means. O(N n) memory: tests only.

Magnitudes. ``relu(q) ** p`` with p up to 1 + alpha overflows float32 for ordinary
magnitudes (|q| = 1e4, p = 5) and float16 far earlier. The output does not change when all
polarity features of one query are multiplied by a positive constant c, or all key
features of one (batch, head), except that ``eps`` then weighs as ``eps / c``. So
:func:`pola_linear_attention` computes the features as :math:`\exp(p \log|x| - M)`, where
``M`` is the largest :math:`p_j \log|x_j|` of the query row (for keys: of the whole
(batch, head)), clamped below at 0, and multiplies ``eps`` by :math:`e^{-(M_q + M_k)}`:
the quotient is the one above up to rounding, every feature lies in [0, 1], and exact
zeros stay exact zeros (they never raise ``M``). The features of non-zero inputs and the
scaled ``eps`` are kept at or above the smallest normal number (``torch.finfo(dtype).tiny``:
exponents are floored at ``log(tiny) + 1/8``, since ``exp(log(tiny))`` rounds to a
subnormal in float32), which keeps the vectorised CPU ``exp`` off its slow path (about
50 times slower on subnormal results) and 0 / (0 + eps) at 0; next to
the row's largest feature (1 when M > 0) or to ``eps`` (when M = 0) the change is below the
rounding of the output. The output is finite for every finite input and every finite
``alpha > 0``, and so are the gradients at exact zeros (0 there, the slope of
``relu(x) ** p`` at 0).

``eps`` may be a float or a tensor broadcastable to (B, h, 1, 1), applied per batch entry
(and head). That serves callers whose keys include padding: zero keys have zero polarity
features and add nothing to the sums, so a call with keys padded by zero rows (k and v set
to exactly zero there) and ``eps * n_real / n`` per entry equals, up to rounding, the call
on the ``n_real`` real keys alone.
"""
import math
import numbers
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..utils.compat import in_graph_capture, is_autocast_enabled, is_compiling

__all__ = [
    'pola_linear_attention', 'pola_linear_attention_reference', 'pola_linear_attention_naive',
    'polarity_features', 'set_default_backend', 'pola_exponent', 'check_alpha', 'BACKENDS'
]

#: Names accepted by ``backend=`` and :func:`set_default_backend`.
BACKENDS = ('auto', 'torch', 'triton')
_default_backend = 'auto'

EpsType = Union[float, Tensor]


def set_default_backend(backend: str) -> str:
    """Set the backend :func:`pola_linear_attention` uses when ``backend`` is None.

    Args:
        backend (str): 'auto' (the Triton kernel for CUDA tensors when Triton can be
            imported, the torch path otherwise), 'torch' or 'triton'.

    Returns:
        str: the previous default.
    """
    global _default_backend
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {backend!r}')
    previous, _default_backend = _default_backend, backend
    return previous


def check_alpha(alpha) -> float:
    """``alpha`` as a float; a ValueError unless it is a finite number > 0."""
    if (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha)
            or alpha <= 0):
        raise ValueError('pola_linear_attention: alpha must be a finite number > 0 '
                         f'(the exponent is 1 + alpha * sigmoid(power)); got {alpha!r}')
    return float(alpha)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha, eps: EpsType) -> float:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError('pola_linear_attention expects q (B,h,N,d), k (B,h,n,d) and v '
                         f'(B,h,n,d); got q {tuple(q.shape)}, k {tuple(k.shape)}, '
                         f'v {tuple(v.shape)}')
    B, h, _, d = q.shape
    if k.shape[:2] != (B, h) or k.shape[3] != d:
        raise ValueError(f'k shape {tuple(k.shape)} does not match q shape '
                         f'{tuple(q.shape)} (expected (B,h,n,d))')
    if v.shape != k.shape:
        raise ValueError(f'v shape {tuple(v.shape)} must equal k shape '
                         f'{tuple(k.shape)}')
    if k.shape[2] == 0:
        raise ValueError('pola_linear_attention got zero keys (n == 0)')
    if power.shape != (1, h, 1, d):
        raise ValueError(f'power shape {tuple(power.shape)} must be (1,{h},1,{d})')
    if isinstance(eps, Tensor):
        if eps.requires_grad:
            raise ValueError('pola_linear_attention: a tensor eps is a constant and '
                             'must not require grad')
        try:
            shape = torch.broadcast_shapes(eps.shape, (B, h, 1, 1))
        except RuntimeError:
            shape = None
        if eps.dim() > 4 or shape != (B, h, 1, 1):
            raise ValueError(f'eps shape {tuple(eps.shape)} must broadcast to '
                             f'(B,h,1,1) = {(B, h, 1, 1)}')
    elif (isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps)
          or eps <= 0):
        raise ValueError(f'pola_linear_attention: eps must be a finite number > 0 or '
                         f'a tensor broadcastable to (B,h,1,1); got {eps!r}')
    return check_alpha(alpha)


def pola_exponent(power: Tensor, alpha: float = 4.0) -> Tensor:
    """The learned exponent ``p = 1 + alpha * sigmoid(power)`` (``power = -inf`` gives
    exactly ``p = 1``).

    Args:
        power (Tensor): The raw ``power`` parameter of a Pola module, (1, h, 1, d).
        alpha (float): The module's ``alpha``. Default: 4.0.
    """
    return 1 + alpha * torch.sigmoid(power)


def polarity_features(x: Tensor, exponent: Tensor) -> Tuple[Tensor, Tensor]:
    """Return ``(relu(x) ** p, relu(-x) ** p)`` for a broadcastable exponent p > 0.

    Both come from one power of ``|x|``: the positive part keeps it where x > 0, the
    negative part is the rest. Unscaled (it overflows where the powers do): the
    reference implementation uses it.

    Args:
        x (Tensor): any shape.
        exponent (Tensor): broadcastable to ``x``.

    Returns:
        tuple[Tensor, Tensor]: the positive and the negative polarity features.
    """
    magnitude = x.abs()**exponent
    positive = torch.where(x > 0, magnitude, 0.)
    return positive, magnitude - positive


def _value_split(d: int) -> int:
    # torch.chunk(v, 2, dim=-1) semantics: the first part takes the larger half.
    return (d + 1) // 2


# --------------------------------------------------------------------------------------
# torch path
# --------------------------------------------------------------------------------------


def _exp_floor(dtype: torch.dtype) -> float:
    """The smallest exponent the op passes to ``exp``: ``log(tiny) + 1/8``.

    ``exp(log(tiny))`` itself rounds to a subnormal number in float32, and a
    subnormal result sends the vectorised CPU ``exp`` to its slow path (about 50
    times slower per element); ``exp(floor)`` is 1.13 ``tiny``, a normal number.
    """
    return math.log(torch.finfo(dtype).tiny) + 0.125


def _scaled_features(x: Tensor,
                     p: Tensor,
                     per_row: bool,
                     shift: Optional[Tensor] = None,
                     keep: bool = False,
                     log_scale: Optional[Tensor] = None):
    """The features ``[x+, x-] * exp(-M)`` as two planes (2, ...) and the shift ``M``.

    ``M`` is max(0, max p log|x|) over the row (``per_row``) or over the last two dims,
    unless given. A feature is ``exp(max(p log max(|x|, tiny) - M, floor))`` (floor:
    :func:`_exp_floor`) on the channel's own polarity (sign of x) and 0 on the other;
    with ``log_scale`` (broadcastable to x), ``log|x|`` is replaced by
    ``log|x| - log_scale``: the features of ``x / scale``. Exact zeros give zero
    features and never raise ``M`` above 0, and no ``log`` or ``exp`` sees 0, inf or a
    result below the smallest normal number (the slow paths of the vectorised CPU
    kernels). The planes are contiguous and serve as scratch space, so that the only
    memory allocated is theirs. With ``keep`` also returns, for the backward pass,
    ``p (log max(|x|, tiny) - log_scale)`` and ``sign(x) / max(|x|, tiny)`` (0 at
    x == 0).
    """
    info = torch.finfo(x.dtype)
    feats = x.new_empty((2, ) + x.shape)
    pos, neg = feats[0], feats[1]
    if keep:
        magnitude = torch.abs(x).clamp_min_(info.tiny)
        scaled = torch.log(magnitude)
    else:
        scaled = torch.abs(x, out=pos).clamp_min_(info.tiny).log_()
    if log_scale is not None:
        scaled.sub_(log_scale)
    scaled.mul_(p)
    if shift is None:
        dims = (-1, ) if per_row else (-2, -1)
        shift = scaled.amax(dim=dims, keepdim=True).clamp_min_(0)
    torch.sub(scaled, shift, out=pos).clamp_min_(_exp_floor(x.dtype)).exp_()
    torch.sign(x, out=neg)
    pos.mul_(neg)  # +-feature, 0 at x == 0
    if keep:
        inv_x = magnitude.reciprocal_().mul_(neg)
    torch.neg(pos, out=neg).clamp_min_(0)
    pos.clamp_min_(0)
    if keep:
        return feats, shift, scaled, inv_x
    return feats, shift


def _assemble_summary(kv: Tensor, k_mean: Tensor) -> Tensor:
    """W (..., 2d, d+2) from ``[k+, k-]^T v / n`` (..., 2d, d) and the key means (..., 2d).

    Rows 0..d-1 multiply q+ and rows d..2d-1 multiply q-; columns: the numerators of the
    same-signed stream (v1 channels), of the opposite stream (v2 channels), then the
    denominators of both streams.
    """
    d = kv.shape[-1]
    d1 = _value_split(d)
    W = kv.new_empty(kv.shape[:-2] + (2 * d, d + 2))
    # same-signed: q+ k+^T v1 + q- k-^T v1 -> rows as they are
    W[..., :d1] = kv[..., :d1]
    # opposite: q+ k-^T v2 + q- k+^T v2 -> rows of k+ and k- swapped
    W[..., :d, d1:d] = kv[..., d:, d1:]
    W[..., d:, d1:d] = kv[..., :d, d1:]
    W[..., d] = k_mean
    W[..., :d, d + 1] = k_mean[..., d:]
    W[..., d:, d + 1] = k_mean[..., :d]
    return W


def _summary_grads(gW: Tensor, d: int) -> Tuple[Tensor, Tensor]:
    """Gradients of [k+, k-]^T v / n (2d, d) and of the key means (2d,) from that of W."""
    d1 = _value_split(d)
    g_kv = gW.new_empty(gW.shape[:-1] + (d, ))
    g_kv[..., :d1] = gW[..., :d1]
    g_kv[..., d:, d1:] = gW[..., :d, d1:d]
    g_kv[..., :d, d1:] = gW[..., d:, d1:d]
    g_mean = gW[..., d].clone()
    g_mean[..., :d] += gW[..., d:, d + 1]
    g_mean[..., d:] += gW[..., :d, d + 1]
    return g_kv, g_mean


def _scaled_eps(eps: EpsType, shift_q: Tensor, shift_k: Tensor) -> Tensor:
    """``eps * exp(-(M_q + M_k))`` (B,h,N,1): the eps of the scaled features, at least
    the smallest normal number (so that 1 / eps is finite)."""
    tiny = torch.finfo(shift_q.dtype).tiny
    scale = torch.add(shift_q, shift_k).neg_().clamp_min_(_exp_floor(shift_q.dtype)).exp_()
    return scale.mul_(eps).clamp_min_(tiny)


def _bmm(x: Tensor) -> Tensor:
    """(..., r, c) -> (prod(...), r, c) for the batched matrix products."""
    return x.reshape((-1, ) + x.shape[-2:])


def _times_planes(x: Tensor, W: Tensor) -> Tensor:
    """``[x+, x-] @ W`` for features as planes (2, ..., m, d) and W (..., 2d, c)."""
    d = x.shape[-1]
    out = torch.matmul(x[0], W[..., :d, :])
    _bmm(out).baddbmm_(_bmm(x[1]), _bmm(W[..., d:, :]))
    return out


def _planes_t_times(x: Tensor, y: Tensor) -> Tensor:
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
_BLOCK_ELEMENTS = 1 << 18


def _blocks(x: Tensor):
    """Blocks of (batch entries, tokens) of x (B, h, N, d) whose feature planes hold
    about ``_BLOCK_ELEMENTS`` each: ranges of tokens of one batch entry when an entry
    is larger than that, else ranges of whole batch entries (e.g. Swin windows); one
    block for small inputs and off the CPU (a GPU wants few large kernels). Yields
    (batch slice, token slice)."""
    B, h, N, d = x.shape
    per_entry = h * N * d
    if x.device.type != 'cpu' or B * per_entry <= 4 * _BLOCK_ELEMENTS:
        yield slice(0, B), slice(0, N)
    elif per_entry > _BLOCK_ELEMENTS:
        rows = -(-N // -(-per_entry // _BLOCK_ELEMENTS))  # equal blocks of <= the size
        for b in range(B):
            for t in range(0, N, rows):
                yield slice(b, b + 1), slice(t, min(t + rows, N))
    else:
        step = _BLOCK_ELEMENTS // per_entry
        for b in range(0, B, step):
            yield slice(b, min(b + step, B)), slice(0, N)


def _key_shift(k: Tensor, p: Tensor, log_scale: Optional[Tensor]) -> Tensor:
    """``M_k`` (B,h,1,1): max(0, the largest p (log max(|k|, tiny) - log_scale) of the
    (batch, head)), from the largest magnitude of each channel (log and the products
    with p > 0 preserve the order)."""
    # two reductions: torch.aminmax over tokens is about 10 times slower on the CPU
    high, low = k.amax(dim=-2, keepdim=True), k.amin(dim=-2, keepdim=True)
    scaled = torch.maximum(high, low.neg_()).clamp_min_(torch.finfo(k.dtype).tiny).log_()
    if log_scale is not None:
        scaled.sub_(log_scale)
    return scaled.mul_(p).amax(dim=-1, keepdim=True).clamp_min_(0)


def _query_block(q: Tensor, p: Tensor, W: Tensor, eps: EpsType, shift_k: Tensor,
                 log_scale: Optional[Tensor], keep: bool):
    """For a block of queries q (B', h, rows, d) and its entries' summary W, eps
    (a float or broadcastable to (B', h, 1, 1)) and key shift: the feature planes, Q W
    (B', h, rows, d + 2) whose last two columns are turned into the reciprocals of the
    two denominators (also returned as that view), and with ``keep`` what
    :func:`_scaled_features` keeps for the backward pass."""
    qf, shift_q, *kept = _scaled_features(q, p, per_row=True, keep=keep, log_scale=log_scale)
    out_full = _times_planes(qf, W)
    d = q.shape[-1]
    inv_den = out_full[..., d:].add_(_scaled_eps(eps, shift_q, shift_k)).reciprocal_()
    return qf, out_full, inv_den, kept


def _batch_rows(eps: EpsType, batch: slice, entries: Tuple[int, int]) -> EpsType:
    """The eps of the batch entries ``batch``: a float as it is, a tensor broadcastable
    to (B, h, 1, 1) (``entries`` = (B, h)) expanded to that and sliced."""
    return eps.expand(*entries, 1, 1)[batch] if isinstance(eps, Tensor) else eps


class _PolaAttentionFunction(torch.autograd.Function):
    """The torch path: O((N + n) d^2), features recomputed in the backward pass.

    Every pass over the tokens runs block by block (:func:`_blocks`): the feature
    planes of a block and the temporaries of its element-wise maths stay in the CPU's
    caches between the operations that make and use them, instead of making one trip
    to main memory per operation over all N tokens, and nothing of size N x d is
    allocated but the results.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, eps: EpsType,
                scale: Optional[Tensor]) -> Tensor:
        B, h, _, d = q.shape
        n = k.shape[-2]
        d1 = _value_split(d)
        p = pola_exponent(power, alpha)
        log_scale = None if scale is None else scale.log()

        # Keys: [k+, k-]^T v and the feature sums, block by block.
        shift_k = _key_shift(k, p, log_scale)
        kv = k.new_zeros((B, h, 2 * d, d))
        k_sum = k.new_zeros((B, h, 2 * d))
        for bs, ts in _blocks(k):
            kf, _ = _scaled_features(
                k[bs, :, ts], p, per_row=False, shift=shift_k[bs], log_scale=log_scale)
            kv[bs] += _planes_t_times(kf, v[bs, :, ts])
            k_sum[bs] += kf.sum(dim=-2).permute(1, 2, 0, 3).flatten(-2)
        W = _assemble_summary(kv.div_(n), k_sum.div_(n))
        del kv, k_sum

        out = _output_like(q)
        for bs, ts in _blocks(q):
            _, out_full, inv_den, _ = _query_block(
                q[bs, :, ts],
                p,
                W[bs],
                _batch_rows(eps, bs, (B, h)),
                shift_k[bs],
                log_scale,
                keep=False)
            out_b = out[bs, :, ts]
            torch.mul(out_full[..., :d1], inv_den[..., :1], out=out_b[..., :d1])
            torch.mul(out_full[..., d1:d], inv_den[..., 1:], out=out_b[..., d1:])
        ctx.alpha = alpha
        ctx.eps_is_tensor = isinstance(eps, Tensor)
        ctx.has_scale = scale is not None
        saved = [q, k, v, power, W, shift_k]
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
        q, k, v, power, W, shift_k = saved
        log_scale = None if scale is None else scale.log()
        alpha, has_scale = ctx.alpha, ctx.has_scale
        B, h, _, d = q.shape
        n = k.shape[-2]
        d1 = _value_split(d)
        p = pola_exponent(power, alpha)
        grad_out = grad_out.to(q.dtype)
        g_p = torch.zeros_like(p)
        g_log_scale = torch.zeros_like(p) if has_scale else None

        # Queries, block by block: recompute num and the denominators. out_c = num_c z
        # (z = 1 / the denominator of c's stream): dL/dnum_c = g_c z,
        # dL/dden = -z sum_c (g_c z) num_c.
        g_q = _output_like(q)
        gW = torch.zeros_like(W)
        for bs, ts in _blocks(q):
            W_b = W[bs]
            qf, out_full, inv_den, (scaled, inv_x) = _query_block(
                q[bs, :, ts],
                p,
                W_b,
                _batch_rows(eps, bs, (B, h)),
                shift_k[bs],
                log_scale,
                keep=True)
            g_out = grad_out[bs, :, ts]
            g_full = out_full.new_empty(out_full.shape)  # [g z, dL/dden_sim, dL/dden_opp]
            torch.mul(g_out[..., :d1], inv_den[..., :1], out=g_full[..., :d1])
            torch.mul(g_out[..., d1:], inv_den[..., 1:], out=g_full[..., d1:d])
            g_num = out_full[..., :d].mul_(g_full[..., :d])
            torch.sum(g_num[..., :d1], dim=-1, keepdim=True, out=g_full[..., d:d + 1])
            torch.sum(g_num[..., d1:], dim=-1, keepdim=True, out=g_full[..., d + 1:])
            g_full[..., d:].mul_(inv_den).neg_()
            del g_num, inv_den, out_full
            gW[bs] += _planes_t_times(qf, g_full)
            for i in range(2):
                qf[i].mul_(torch.matmul(g_full, W_b[..., i * d:(i + 1) * d, :].transpose(-2, -1)))
            del g_full
            _feature_grads(qf, scaled, inv_x, p, g_q[bs, :, ts], g_p, g_log_scale)
            del qf, scaled, inv_x

        # Keys, block by block: W holds [k+, k-]^T v / n and the key means.
        g_kv, g_mean = _summary_grads(gW, d)
        g_kv.div_(n)
        g_mean.div_(n)
        del gW
        g_k, g_v = _output_like(k), _output_like(v)
        for bs, ts in _blocks(k):
            g_kv_b, g_mean_b, v_b = g_kv[bs], g_mean[bs], v[bs, :, ts]
            kf, _, scaled, inv_x = _scaled_features(
                k[bs, :, ts], p, False, shift=shift_k[bs], keep=True, log_scale=log_scale)
            g_v[bs, :, ts] = _times_planes(kf, g_kv_b)
            for i in range(2):
                rows = slice(i * d, (i + 1) * d)
                g_feat = torch.matmul(v_b, g_kv_b[..., rows, :].transpose(-2, -1))
                kf[i].mul_(g_feat.add_(g_mean_b[..., None, rows]))
            del g_feat
            _feature_grads(kf, scaled, inv_x, p, g_k[bs, :, ts], g_p, g_log_scale)
            del kf, scaled, inv_x
        s = torch.sigmoid(power)
        g_power = g_p.mul_(s * (1 - s) * alpha)
        g_scale = None
        if has_scale:
            g_scale = g_log_scale.div_(scale)
        return g_q, g_k, g_v, g_power, None, None, g_scale


def _torch_path(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, eps: EpsType,
                scale: Optional[Tensor]) -> Tensor:
    if isinstance(eps, Tensor):
        eps = eps.to(q.dtype)
    return _PolaAttentionFunction.apply(q, k, v, power, alpha, eps, scale)


def _plain_features(x: Tensor, p: Tensor, log_scale: Optional[Tensor],
                    per_row: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`_scaled_features` in out-of-place operations: ``(x+, x-, M)``."""
    scaled = torch.log(torch.abs(x).clamp_min(torch.finfo(x.dtype).tiny))
    if log_scale is not None:
        scaled = scaled - log_scale
    scaled = scaled * p
    # max over dims, one at a time (ReduceMax of every ONNX opset)
    shift = scaled.max(dim=-1, keepdim=True)[0]
    if not per_row:
        shift = shift.max(dim=-2, keepdim=True)[0]
    shift = shift.clamp_min(0)
    signed = torch.exp((scaled - shift).clamp_min(_exp_floor(x.dtype))) * torch.sign(x)
    return torch.relu(signed), torch.relu(-signed), shift


def _plain_path(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, eps: EpsType,
                scale: Optional[Tensor]) -> Tensor:
    """The torch path's computation (the same features, shifts, floors and scaled eps)
    in plain out-of-place tensor operations, for graph captures (jit trace, ONNX
    export, ``torch.compile``, ``torch.export``): no autograd Function, no blocks, no
    in-place writes and no Python use of sizes, so a captured graph records every
    step and serves any token count. Autograd differentiates it as it stands.

    With ``K = [k+, k-]`` and ``Q = [q+, q-]`` (features scaled as in the torch path),
    stream c (its value channels ``v_c``) is ``Q W_c`` with ``W_c = [K^T v_c / n,
    mean(K)]``, the rows of k+ and k- swapped for the opposite stream; the last column
    is the denominator. The same matrix products as the torch path's (``K^T v`` and
    ``Q W``), which FLOP counters of a trace count as the op's.
    """
    if isinstance(eps, Tensor):
        eps = eps.to(q.dtype)
    p = pola_exponent(power, alpha)
    log_scale = None if scale is None else torch.log(scale)
    q_pos, q_neg, shift_q = _plain_features(q, p, log_scale, per_row=True)
    k_pos, k_neg, shift_k = _plain_features(k, p, log_scale, per_row=False)
    queries = torch.cat([q_pos, q_neg], dim=-1)  # (B, h, N, 2d)
    keys_t = torch.cat([k_pos, k_neg], dim=-1).transpose(-2, -1)  # (B, h, 2d, n)
    k_mean = keys_t.mean(dim=-1, keepdim=True)
    inv_n = 1. / k.shape[-2]
    eps_scaled = torch.exp((-(shift_q + shift_k)).clamp_min(_exp_floor(q.dtype)))
    eps_scaled = (eps_scaled * eps).clamp_min(torch.finfo(q.dtype).tiny)
    outs = []
    # torch.chunk(v, 2, -1): v1 the first ceil(d/2) channels, v2 the rest (none at d == 1)
    for i, values in enumerate(torch.chunk(v, 2, dim=-1)):
        summary = torch.cat([torch.matmul(keys_t, values) * inv_n, k_mean], dim=-1)
        if i == 1:  # opposite signs: q+ meets k-, q- meets k+
            summary = torch.cat(summary.chunk(2, dim=-2)[::-1], dim=-2)
        full = torch.matmul(queries, summary)  # numerators, then the denominator
        outs.append(full[..., :-1] * torch.reciprocal(full[..., -1:] + eps_scaled))
    return torch.cat(outs, dim=-1)


def _resolve_backend(backend: Optional[str], q: Tensor, k: Tensor, v: Tensor) -> str:
    backend = _default_backend if backend is None else backend
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS} or None, got {backend!r}')
    if backend == 'auto':
        if q.device.type != 'cuda':
            return 'torch'
        from . import pola_attention_triton
        if not pola_attention_triton.available():
            _log_triton_fallback_once(pola_attention_triton.unavailable_reason())
            return 'torch'
        return 'triton' if pola_attention_triton.supports(q, k, v) else 'torch'
    return backend


_triton_fallback_logged = False


def _log_triton_fallback_once(reason: str) -> None:
    """Say once per process that backend='auto' takes the torch path on CUDA, and why."""
    global _triton_fallback_logged
    if _triton_fallback_logged:
        return
    _triton_fallback_logged = True
    import logging

    from mmengine.logging import print_log
    print_log(
        f'pola_linear_attention: {reason}; backend="auto" uses the torch path on CUDA',
        logger='current',
        level=logging.WARNING)


def pola_linear_attention(q: Tensor,
                          k: Tensor,
                          v: Tensor,
                          power: Tensor,
                          alpha: float = 4.0,
                          eps: EpsType = 1e-6,
                          backend: Optional[str] = None,
                          scale: Optional[Tensor] = None) -> Tensor:
    """Polarity-aware linear attention without any N x n matrix.

    Half-precision inputs (and calls under autocast) are computed in float32 and the
    result cast back to the input dtype.

    Args:
        q (Tensor): queries (B, h, N, d), already divided by the learned scale
            (or see ``scale``).
        k (Tensor): keys (B, h, n, d), n >= 1 (the same).
        v (Tensor): values (B, h, n, d).
        power (Tensor): the raw exponent parameter (1, h, 1, d).
        alpha (float): the exponent is ``1 + alpha * sigmoid(power)``; finite, > 0.
            Default: 4.0.
        eps (float | Tensor): added to each normaliser (``sum of scores + n * eps``);
            a positive float, or a tensor broadcastable to (B, h, 1, 1) for one value
            per batch entry (see the module docstring on padded keys). Not
            differentiated. Default: 1e-6.
        backend (str, optional): 'torch', 'triton' (CUDA tensors, Triton installed,
            head width <= 128) or 'auto' (Triton where it applies, else torch); None
            takes the default of :func:`set_default_backend` ('auto').
        scale (Tensor, optional): a positive (1, h, 1, d) divisor of q and k (the
            modules' ``softplus(scale)``), differentiable: the result of passing
            ``q / scale`` and ``k / scale``, up to rounding. The torch path folds it
            into the features (``log|x| - log(scale)``), so those two tensors are
            neither computed nor kept for the backward pass. Default: None.

    Returns:
        Tensor: (B, h, N, d), the same-signed stream in the first ``ceil(d/2)`` channels
        of every head and the opposite-signed stream in the rest.
    """
    alpha = _check_inputs(q, k, v, power, alpha, eps)
    if scale is not None and scale.shape != power.shape:
        raise ValueError(f'scale shape {tuple(scale.shape)} must be that of power '
                         f'{tuple(power.shape)}')
    backend = _resolve_backend(backend, q, k, v)
    capture = in_graph_capture()
    if capture and not is_compiling():
        backend = 'torch'  # a trace or an export records the plain formulation
    path = _plain_path if capture else _torch_path
    if backend == 'triton':
        from . import pola_attention_triton
        if scale is not None:
            q, k = q / scale, k / scale
        return pola_attention_triton.pola_linear_attention_triton(q, k, v, power, alpha, eps)
    low_precision = (torch.float16, torch.bfloat16)
    if q.dtype in low_precision or is_autocast_enabled(q.device.type):
        with torch.autocast(q.device.type, enabled=False):
            out = path(q.float(), k.float(), v.float(), power.float(), alpha, eps,
                       None if scale is None else scale.float())
        return out.to(q.dtype)
    return path(q, k, v, power, alpha, eps, scale)


# --------------------------------------------------------------------------------------
# the official order of operations, and the explicit weights
# --------------------------------------------------------------------------------------


def pola_linear_attention_naive(q: Tensor,
                                k: Tensor,
                                v: Tensor,
                                power: Tensor,
                                alpha: float = 4.0,
                                eps: EpsType = 1e-6) -> Tensor:
    """The official formulation: the order of operations of the official PolaFormer code.

    ``relu(x) ** p`` and ``relu(-x) ** p`` for queries and keys, the concatenated
    ``q_sim = [q+, q-]``, ``q_opp = [q-, q+]`` and ``k = [k+, k-]``, and per stream its own
    normaliser ``1 / (q_* . mean(k) + eps)`` and key-value product
    ``(k^T / sqrt(n)) (v_* / sqrt(n))``, autograd through everything, in the input dtype.
    It overflows where the powers do. Benchmarks compare against it.

    Args:
        q (Tensor): queries (B, h, N, d).
        k (Tensor): keys (B, h, n, d).
        v (Tensor): values (B, h, n, d).
        power (Tensor): the raw exponent parameter (1, h, 1, d).
        alpha (float): the exponent is ``1 + alpha * sigmoid(power)``. Default: 4.0.
        eps (float | Tensor): as for :func:`pola_linear_attention`. Default: 1e-6.

    Returns:
        Tensor: (B, h, N, d), laid out as :func:`pola_linear_attention`'s.
    """
    alpha = _check_inputs(q, k, v, power, alpha, eps)
    p = pola_exponent(power, alpha)
    q_pos = torch.relu(q)**p
    q_neg = torch.relu(-q)**p
    k_pos = torch.relu(k)**p
    k_neg = torch.relu(-k)**p
    q_sim = torch.cat([q_pos, q_neg], dim=-1)
    q_opp = torch.cat([q_neg, q_pos], dim=-1)
    keys = torch.cat([k_pos, k_neg], dim=-1)
    n, d1 = keys.shape[-2], _value_split(v.shape[-1])
    v1, v2 = v[..., :d1], v[..., d1:]  # torch.chunk(v, 2, -1), also for d == 1
    k_mean = keys.mean(dim=-2, keepdim=True).transpose(-2, -1)
    key_t = keys.transpose(-2, -1) * n**-0.5
    outs = []
    for queries, values in ((q_sim, v1), (q_opp, v2)):
        z = 1 / (queries @ k_mean + eps)
        kv = key_t @ (values * n**-0.5)
        outs.append(queries @ kv * z)
    return torch.cat(outs, dim=-1)


def pola_linear_attention_reference(q: Tensor,
                                    k: Tensor,
                                    v: Tensor,
                                    power: Tensor,
                                    alpha: float = 4.0,
                                    eps: EpsType = 1e-6) -> Tensor:
    """Explicit-weights version: forms both N x n attention maps. Tests only.

    Args:
        q (Tensor): queries (B, h, N, d).
        k (Tensor): keys (B, h, n, d).
        v (Tensor): values (B, h, n, d).
        power (Tensor): the raw exponent parameter (1, h, 1, d).
        alpha (float): the exponent is ``1 + alpha * sigmoid(power)``. Default: 4.0.
        eps (float | Tensor): as for :func:`pola_linear_attention`. Default: 1e-6.

    Returns:
        Tensor: (B, h, N, d), laid out as :func:`pola_linear_attention`'s.
    """
    alpha = _check_inputs(q, k, v, power, alpha, eps)
    n, d1 = k.shape[-2], _value_split(q.shape[-1])
    p = pola_exponent(power, alpha)
    q_pos, q_neg = polarity_features(q, p)
    keys = torch.cat(polarity_features(k, p), dim=-1)
    v1, v2 = v[..., :d1], v[..., d1:]

    outs = []
    for queries, values in ((torch.cat([q_pos, q_neg], -1), v1), (torch.cat([q_neg, q_pos],
                                                                            -1), v2)):
        scores = torch.matmul(queries, keys.transpose(-2, -1))  # (B,h,N,n)
        weights = scores / (scores.sum(dim=-1, keepdim=True) + n * eps)
        outs.append(torch.matmul(weights, values))
    return torch.cat(outs, dim=-1)
