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
rounding of the output. The gradients at exact zeros are 0 (the slope of
``relu(x) ** p`` at 0).

Exponent range. These shared shifts lose a row when every term of one of its streams
lies far below them: a score is a query feature times a key feature, each floored near
``tiny``, and with p up to 1 + alpha the exponents of one (batch, head) spread by
``(1 + alpha)`` times the spread of ``log|x|`` (already at alpha = 50 for keys drawn
as ``randn + 1.5``, mostly positive, and queries ``randn``). Each block of queries therefore
checks its denominators; where one is below ``tiny * 2**50`` the block is computed
with an exact scheme instead (:func:`_exact_block`): the keys of each channel and
sign shifted by their own largest exponent, each query row per stream by the largest
exponent it meets there, so that the largest term of every row and stream is 1 x (a key
mean of at least 1 / n). For moderate magnitudes at the usual alpha no block needs it.
What remains is float32 precision: the rounding of ``p log|x|`` grows with p, which is
why :func:`check_alpha` refuses ``alpha > ALPHA_MAX``. Below that bound the output of
float32 inputs of moderate magnitude is within 1e-4 of the exact one, and it is finite
for every finite input.

``eps`` may be a float or a tensor broadcastable to (B, h, 1, 1), applied per batch entry
(and head). That serves callers whose keys include padding: zero keys have zero polarity
features and add nothing to the sums, so a call with keys padded by zero rows (k and v set
to exactly zero there) and ``eps * n_real / n`` per entry equals, up to rounding, the call
on the ``n_real`` real keys alone.
"""
import math
import numbers
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from ..utils.compat import in_graph_capture, is_autocast_enabled, is_compiling

__all__ = [
    'pola_linear_attention', 'pola_linear_attention_reference', 'pola_linear_attention_naive',
    'polarity_features', 'set_default_backend', 'pola_exponent', 'check_alpha', 'ALPHA_MAX',
    'BACKENDS'
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


#: The largest ``alpha`` the op takes (:func:`check_alpha` says why).
ALPHA_MAX = 100.0


def check_alpha(alpha) -> float:
    """``alpha`` as a float; a ValueError unless it is a finite number in (0, ``ALPHA_MAX``].

    The bound is one of float32 precision, not of range (the op's shifts carry any
    exponent): a feature is ``exp(p log|x| - M)`` with ``p`` up to ``1 + alpha``, so the
    float32 rounding of ``p log|x|`` (2**-24 relative) moves it by about
    ``3 p |log|x|| 2**-24`` relative, and beyond ``alpha = ALPHA_MAX`` outputs for inputs
    of moderate magnitude (|q|, |k| of 0.1 to 10) lose the 1e-4 accuracy they keep
    below it (docs/advanced_guides/method.md, "The exponent's range").
    """
    if (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha)
            or alpha <= 0):
        raise ValueError('pola_linear_attention: alpha must be a finite number > 0 '
                         f'(the exponent is 1 + alpha * sigmoid(power)); got {alpha!r}')
    if alpha > ALPHA_MAX:
        raise ValueError(
            f'pola_linear_attention: alpha must be at most {ALPHA_MAX:g}; got {alpha!r}. '
            'The exponent 1 + alpha * sigmoid(power) multiplies the float32 rounding of '
            'log|x| (2**-24 relative), and beyond that bound the attention weights of '
            'moderate inputs are off by more than 1e-4')
    return float(alpha)


def _check_dtypes_and_devices(q: Tensor, k: Tensor, v: Tensor, power: Tensor) -> None:
    named = (('q', q), ('k', k), ('v', v))
    for name, t in named + (('power', power), ):
        if not t.dtype.is_floating_point:
            raise ValueError(f'pola_linear_attention: {name} must be a floating-point tensor, '
                             f'got {t.dtype}')
        if t.device != q.device:
            raise ValueError(f'pola_linear_attention: q is on {q.device} but {name} is on '
                             f'{t.device}; all tensors must be on one device')
    wide = [name for name, t in named if t.dtype == torch.float64]
    narrow = [name for name, t in named if t.dtype != torch.float64]
    if wide and narrow:
        a, b = sorted([wide[0], narrow[0]], key='qkv'.index)
        dtypes = dict((name, t.dtype) for name, t in named)
        raise ValueError(f'pola_linear_attention: {a} is {dtypes[a]} but {b} is {dtypes[b]}; '
                         'float64 must be given for q, k and v alike (float16, bfloat16 and '
                         'float32 may be mixed: they are computed in float32)')


def _check_positive(name: str, t: Tensor, why: str) -> None:
    """A ValueError unless every value of ``t`` is finite and > 0 (reads the answer
    back from ``t``'s device; skipped while a trace or ``torch.compile`` records the
    code, whose graph cannot branch on a value)."""
    if in_graph_capture():
        return
    bad = ~(torch.isfinite(t) & (t > 0))
    if bool(bad.any()):
        value = t.detach()[bad].flatten()[0].item()
        raise ValueError(f'pola_linear_attention: {name} must be finite and > 0 everywhere '
                         f'({why}); the tensor {name} holds {value!r}')


def _check_inputs(q: Tensor,
                  k: Tensor,
                  v: Tensor,
                  power: Tensor,
                  alpha,
                  eps: EpsType,
                  scale: Optional[Tensor] = None) -> float:
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
    _check_dtypes_and_devices(q, k, v, power)
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
        _check_positive('eps', eps, 'as a float eps must be')
    elif (isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps)
          or eps <= 0):
        raise ValueError(f'pola_linear_attention: eps must be a finite number > 0 or '
                         f'a tensor broadcastable to (B,h,1,1); got {eps!r}')
    if scale is not None:
        if not isinstance(scale, Tensor) or scale.shape != power.shape:
            shape = tuple(scale.shape) if isinstance(scale, Tensor) else type(scale).__name__
            raise ValueError(f'scale shape {shape} must be that of power '
                             f'{tuple(power.shape)}')
        if not scale.dtype.is_floating_point or scale.device != q.device:
            raise ValueError('pola_linear_attention: scale must be a floating-point tensor '
                             f'on {q.device}; got {scale.dtype} on {scale.device}')
        _check_positive('scale', scale, 'it divides q and k')
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
    if B * per_entry == 0:
        return  # no block: nothing to compute
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


def _key_shift(shifts: Tensor) -> Tensor:
    """``M_k`` (B,h,1,1): max(0, the largest p (log max(|k|, tiny) - log_scale) of the
    (batch, head)), the largest of its channels' and signs' ``shifts``
    (:func:`_exact_shifts`; log and the products with p > 0 preserve the order)."""
    return shifts.amax(dim=-1, keepdim=True).amax(dim=0).clamp_min_(0)


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


# --------------------------------------------------------------------------------------
# the exact scheme, for the blocks the shared shifts cannot carry
# --------------------------------------------------------------------------------------


def _inexact(inv_den: Tensor) -> bool:
    """Whether a block's shared shifts lose its rows: some denominator (reciprocal in
    ``inv_den``) below ``tiny * 2**50``.

    Above that the terms the shared shifts floor or flush (each under ``tiny``, at most
    ``4 d`` of them per row and stream) change a result by less than ``4 d * 2**-50``
    relative; below it they may be all there is (the row's terms all far below the
    shifts). Reads the answer back from the device.
    """
    limit = 1 / (torch.finfo(inv_den.dtype).tiny * 2.0**50)
    return bool((inv_den > limit).any())


def _exact_shifts(k: Tensor, p: Tensor, log_scale: Optional[Tensor]) -> Tensor:
    """``c`` (2, B, h, 1, d): the largest ``p (log|k| - log_scale)`` among the positive
    keys (``c[0]``) and among the negative keys (``c[1]``) of each channel and (batch,
    head); ``-finfo.max / 16`` (:func:`_absent`) where a channel has no key of that
    sign."""
    # two reductions: torch.aminmax over tokens is about 10 times slower on the CPU
    high, low = k.amax(dim=-2, keepdim=True), k.amin(dim=-2, keepdim=True).neg_()
    extremes = torch.stack([high, low])
    shifts = extremes.clamp_min(torch.finfo(k.dtype).tiny).log_()
    if log_scale is not None:
        shifts.sub_(log_scale)
    return shifts.mul_(p).masked_fill_(extremes <= 0, -_absent(k.dtype))


def _absent(dtype: torch.dtype) -> float:
    """A finite stand-in for an infinite exponent (a sign that no key of a channel has,
    an exact zero): ``finfo.max / 16``, so that sums of a few of them stay finite and
    products with the 0 / 1 sign masks stay exact (``0 * inf`` would be NaN)."""
    return torch.finfo(dtype).max / 16


def _exact_floor(dtype: torch.dtype) -> float:
    """The smallest exponent of the exact scheme's features: ``0.4 log(tiny)`` (2**-50
    in float32). Its features are relative to a largest term of 1 (at least 1 / n per
    stream), so features floored there change a result by at most ``4 d n`` times that,
    relative; and the product of two floored features, or of one with a key mean, stays
    a normal number (products that round to subnormals send the CPU's matrix products
    down a path many times slower)."""
    return 0.4 * math.log(torch.finfo(dtype).tiny)


def _sign_masks(x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``sign(x)`` and the masks 1 where x > 0 and 1 where x < 0 (0 elsewhere), by
    arithmetic (``torch.where`` is many times slower on the CPU)."""
    sign = torch.sign(x)
    positive = sign.clamp_min(0)
    return sign, positive, positive - sign


def _scaled_log(x: Tensor, p: Tensor, log_scale: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """``p (log max(|x|, tiny) - log_scale)`` and ``max(|x|, tiny)``."""
    magnitude = torch.abs(x).clamp_min_(torch.finfo(x.dtype).tiny)
    scaled = torch.log(magnitude)
    if log_scale is not None:
        scaled.sub_(log_scale)
    return scaled.mul_(p), magnitude


def _exact_key_features(k: Tensor,
                        p: Tensor,
                        shifts: Tensor,
                        log_scale: Optional[Tensor],
                        keep: bool = False):
    """Key feature planes (2, ...) with each channel and sign shifted by its own largest
    exponent ``c`` (:func:`_exact_shifts`): every non-zero feature lies in (0, 1] and
    the largest of each channel and sign is 1. With ``keep`` also what
    :func:`_feature_grads` needs: ``p (log max(|k|, tiny) - log_scale)`` and
    ``sign(k) / max(|k|, tiny)``."""
    scaled, magnitude = _scaled_log(k, p, log_scale)
    sign, positive, negative = _sign_masks(k)
    exponent = torch.addcmul(scaled, positive, shifts[0], value=-1)
    exponent.addcmul_(negative, shifts[1], value=-1).clamp_min_(_exact_floor(k.dtype)).exp_()
    feats = torch.stack([exponent.mul(positive), exponent.mul_(negative)])
    if keep:
        return feats, scaled, magnitude.reciprocal_().mul_(sign)
    return feats


def _exact_query_features(q: Tensor,
                          p: Tensor,
                          shifts: Tensor,
                          log_scale: Optional[Tensor],
                          keep: bool = False):
    """Per stream (same-signed, then opposite) the query feature planes (2, ...) of the
    exact scheme and their row shift ``M`` (..., 1); with ``keep`` also ``scaled`` and
    ``inv_x`` as :func:`_exact_key_features` gives them.

    A query feature meets, in each stream, the keys of one sign per channel, whose
    features :func:`_exact_key_features` shifts by that channel and sign's ``c``: the
    same-signed stream pairs a positive q with ``c[0]`` and a negative one with
    ``c[1]``, the opposite stream the other way round. Per row and stream the
    features are therefore ``exp(p log|q| + c - M)`` with ``M`` the row's largest
    ``p log|q| + c`` in that stream (exact zeros left out), so that every (query
    feature) x (key feature) product is the unscaled one times ``exp(-M)``, and the
    largest term of every row and stream is (largest feature 1) x (a key feature 1),
    whatever ``alpha`` and the magnitudes. ``M`` and ``c`` are constants of the
    derivative: the output does not depend on them.
    """
    scaled, magnitude = _scaled_log(q, p, log_scale)
    sign, positive, negative = _sign_masks(q)
    # exact zeros: an exponent far below any other, so that they never set M
    base = torch.addcmul(scaled, positive + negative - 1, scaled.new_tensor(_absent(q.dtype)))
    floor = _exact_floor(q.dtype)
    streams = []
    for c_pos, c_neg in ((shifts[0], shifts[1]), (shifts[1], shifts[0])):
        exponent = torch.addcmul(base, positive, c_pos).addcmul_(negative, c_neg)
        shift = exponent.amax(dim=-1, keepdim=True)
        feature = exponent.sub_(shift).clamp_min_(floor).exp_()
        streams.append((torch.stack([feature.mul(positive), feature.mul_(negative)]), shift))
    if keep:
        return streams, scaled, magnitude.reciprocal_().mul_(sign)
    return streams


def _exact_eps(eps: EpsType, shift: Tensor) -> Tensor:
    """``eps * exp(-M)``, the eps of the exact scheme's units, kept in [tiny, 1 / tiny]
    (outside, eps or the scores are negligible against the other)."""
    info = torch.finfo(shift.dtype)
    factor = shift.neg().clamp_(_exp_floor(shift.dtype), -math.log(info.tiny)).exp_()
    return factor.mul_(eps).clamp_(info.tiny, 1 / info.tiny)


def _stream_columns(W: Tensor) -> List[Tensor]:
    """The columns of W (..., 2d, d + 2) each stream uses: its numerators, then its
    denominator (same-signed: ``:ceil(d/2)`` and ``d``; opposite: the rest and
    ``d + 1``)."""
    d = W.shape[-1] - 2
    d1 = _value_split(d)
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
    summary ``W`` (made of :func:`_exact_key_features`) and its ``shifts``: the output
    into ``out``, or, given ``grad_out``, the backward pass: the gradient of q into
    ``g_q``, those of W, p and ``log_scale`` added to ``g_W``, ``g_p`` and
    ``g_log_scale``. Per stream as the shared scheme's blocks do for both at once."""
    d = q.shape[-1]
    d1 = _value_split(d)
    backward = grad_out is not None
    streams = _exact_query_features(q, p, shifts, log_scale, keep=backward)
    if backward:
        streams, scaled, inv_x = streams
    prod = None
    for stream, ((planes, shift), W_s) in enumerate(zip(streams, _stream_columns(W))):
        width = W_s.shape[-1] - 1
        full = _times_planes(planes, W_s)  # (..., rows, width + 1): numerators, denominator
        inv_den = full[..., width:].add_(_exact_eps(eps, shift)).reciprocal_()
        columns = slice(0, d1) if stream == 0 else slice(d1, d)
        if not backward:
            torch.mul(full[..., :width], inv_den, out=out[..., columns])
            continue
        # out = num z (z = 1 / den): dL/dnum = g z, dL/dden = -z sum(g z num)
        g_full = full.new_empty(full.shape)
        torch.mul(grad_out[..., columns], inv_den, out=g_full[..., :width])
        g_num = full[..., :width].mul_(g_full[..., :width])
        torch.sum(g_num, dim=-1, keepdim=True, out=g_full[..., width:])
        g_full[..., width:].mul_(inv_den).neg_()
        del g_num, full, inv_den
        g_W_s = _planes_t_times(planes, g_full)
        g_W[..., columns] += g_W_s[..., :width]
        g_W[..., d + stream] += g_W_s[..., width]
        for j in range(2):
            planes[j].mul_(torch.matmul(g_full, W_s[..., j * d:(j + 1) * d, :].transpose(-2, -1)))
        prod = planes if prod is None else prod.add_(planes)
    if backward:
        _feature_grads(prod, scaled, inv_x, p, g_q, g_p, g_log_scale)


def _key_summary(k: Tensor, v: Tensor, features) -> Tensor:
    """W (B, h, 2d, d + 2) from the key feature planes ``features(bs, ts)`` of each block
    of k (:func:`_blocks`): ``[k+, k-]^T v / n`` and the feature means."""
    B, h, n, d = k.shape
    kv = k.new_zeros((B, h, 2 * d, d))
    k_sum = k.new_zeros((B, h, 2 * d))
    for bs, ts in _blocks(k):
        kf = features(bs, ts)
        kv[bs] += _planes_t_times(kf, v[bs, :, ts])
        k_sum[bs] += kf.sum(dim=-2).permute(1, 2, 0, 3).flatten(-2)
    return _assemble_summary(kv.div_(n), k_sum.div_(n))


def _key_grads(k: Tensor, v: Tensor, p: Tensor, gW: Tensor, features, g_k: Tensor, g_v: Tensor,
               g_p: Tensor, g_log_scale: Optional[Tensor], accumulate: bool) -> None:
    """The gradients of k and v from that of W (made by :func:`_key_summary` of the
    same ``features(bs, ts)``, which here returns the planes with ``scaled`` and
    ``inv_x``), written into (or with ``accumulate`` added to) ``g_k`` and ``g_v``;
    those of p and ``log_scale`` added to ``g_p`` and ``g_log_scale``."""
    d, n = k.shape[-1], k.shape[-2]
    g_kv, g_mean = _summary_grads(gW, d)
    g_kv.div_(n)
    g_mean.div_(n)
    for bs, ts in _blocks(k):
        g_kv_b, g_mean_b, v_b = g_kv[bs], g_mean[bs], v[bs, :, ts]
        kf, scaled, inv_x = features(bs, ts)
        g_v_b = _times_planes(kf, g_kv_b)
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

    Every pass over the tokens runs block by block (:func:`_blocks`): the feature
    planes of a block and the temporaries of its element-wise maths stay in the CPU's
    caches between the operations that make and use them, instead of making one trip
    to main memory per operation over all N tokens, and nothing of size N x d is
    allocated but the results.

    Two schemes of shifts. The shared one (every query row by its largest feature,
    all keys of a (batch, head) by theirs) serves every block whose denominators stay
    above ``tiny * 2**50`` (:func:`_inexact`): for moderate inputs and exponents, all
    of them. A block below that (large ``alpha``, magnitudes far apart) is computed
    with the exact scheme of :func:`_exact_block` instead, against a second key
    summary made only then, and so are the blocks after it; keys that the shared
    shifts cannot carry at all (:func:`_beyond_shared_shifts`) send every block there
    at once. The backward pass takes each block the way the forward pass took it.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, eps: EpsType,
                scale: Optional[Tensor]) -> Tensor:
        B, h, _, d = q.shape
        d1 = _value_split(d)
        p = pola_exponent(power, alpha)
        log_scale = None if scale is None else scale.log()

        # Keys: [k+, k-]^T v and the feature sums, block by block, with the shared
        # shifts unless some channel and sign of keys lies wholly under their floor.
        shifts = _exact_shifts(k, p, log_scale)
        shift_k = _key_shift(shifts)
        W_x = None  # the exact scheme's summary, made when a block first needs it
        if _beyond_shared_shifts(shifts, shift_k):
            W = shift_k.new_zeros(0)
            W_x = _exact_summary(k, v, p, shifts, log_scale)
        else:
            W = _key_summary(
                k, v, lambda bs, ts: _scaled_features(
                    k[bs, :, ts], p, per_row=False, shift=shift_k[bs], log_scale=log_scale)[0])

        out = _output_like(q)
        exact_blocks = []
        for i, (bs, ts) in enumerate(_blocks(q)):
            eps_b = _batch_rows(eps, bs, (B, h))
            out_b = out[bs, :, ts]
            if W_x is None:  # the shared shifts, while every block so far kept its rows
                _, out_full, inv_den, _ = _query_block(
                    q[bs, :, ts], p, W[bs], eps_b, shift_k[bs], log_scale, keep=False)
                if not _inexact(inv_den):
                    torch.mul(out_full[..., :d1], inv_den[..., :1], out=out_b[..., :d1])
                    torch.mul(out_full[..., d1:d], inv_den[..., 1:], out=out_b[..., d1:])
                    continue
                del out_full, inv_den
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
        gW_x = None if W_x is None else torch.zeros_like(W_x)
        fast_blocks = 0
        for i, (bs, ts) in enumerate(_blocks(q)):
            eps_b = _batch_rows(eps, bs, (B, h))
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
                    g_W=gW_x[bs],
                    g_p=g_p,
                    g_log_scale=g_log_scale)
                continue
            fast_blocks += 1
            W_b = W[bs]
            qf, out_full, inv_den, (scaled, inv_x) = _query_block(
                q[bs, :, ts], p, W_b, eps_b, shift_k[bs], log_scale, keep=True)
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
            for j in range(2):
                qf[j].mul_(torch.matmul(g_full, W_b[..., j * d:(j + 1) * d, :].transpose(-2, -1)))
            del g_full
            _feature_grads(qf, scaled, inv_x, p, g_q[bs, :, ts], g_p, g_log_scale)
            del qf, scaled, inv_x

        # Keys, block by block: W holds [k+, k-]^T v / n and the key means, of the
        # shared shifts (fast blocks) and of the exact ones (exact blocks).
        g_k, g_v = _output_like(k), _output_like(v)
        if not fast_blocks and not exact_blocks:  # no query: the keys get 0
            g_k.zero_()
            g_v.zero_()
        if fast_blocks:

            def shared(bs, ts):
                kf, _, scaled, inv_x = _scaled_features(
                    k[bs, :, ts], p, False, shift=shift_k[bs], keep=True, log_scale=log_scale)
                return kf, scaled, inv_x

            _key_grads(k, v, p, gW, shared, g_k, g_v, g_p, g_log_scale, accumulate=False)
        if exact_blocks:
            _key_grads(
                k,
                v,
                p,
                gW_x,
                lambda bs, ts: _exact_key_features(
                    k[bs, :, ts], p, shifts[:, bs], log_scale, keep=True),
                g_k,
                g_v,
                g_p,
                g_log_scale,
                accumulate=fast_blocks > 0)
        s = torch.sigmoid(power)
        g_power = g_p.mul_(s * (1 - s) * alpha)
        g_scale = None
        if has_scale:
            g_scale = g_log_scale.div_(scale)
        return g_q, g_k, g_v, g_power, None, None, g_scale


def _exact_summary(k: Tensor, v: Tensor, p: Tensor, shifts: Tensor,
                   log_scale: Optional[Tensor]) -> Tensor:
    """The key summary of the exact scheme, of its ``shifts`` (:func:`_exact_shifts`)."""
    return _key_summary(
        k, v, lambda bs, ts: _exact_key_features(k[bs, :, ts], p, shifts[:, bs], log_scale))


def _beyond_shared_shifts(shifts: Tensor, shift_k: Tensor) -> bool:
    """Whether the largest key feature of some channel and sign (``shifts``) lies under
    the shared shifts' floor (:func:`_exp_floor`) below its (batch, head)'s ``M_k``: all
    its features would be floored, and the rows that meet them lost. Then every block
    takes the exact scheme at once (its test would only fail block after block, each
    after a pass whose floored products run the slow path of the CPU's matrix
    products)."""
    present = shifts > -_absent(shifts.dtype) / 2
    return bool((present & (shifts - shift_k < _exp_floor(shifts.dtype))).any())


def _torch_path(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, eps: EpsType,
                scale: Optional[Tensor]) -> Tensor:
    if isinstance(eps, Tensor):
        eps = eps.to(device=q.device, dtype=q.dtype)
    power = power.to(q.dtype)
    if scale is not None:
        scale = scale.to(q.dtype)
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

    Half-precision inputs, inputs mixing float16 / bfloat16 / float32, and calls under
    autocast are computed in float32 and the result cast to q's dtype; float64 must be
    given for q, k and v alike. Every tensor must be on q's device. Accurate for every
    ``alpha`` it takes (module docstring, "Exponent range").

    Args:
        q (Tensor): queries (B, h, N, d), already divided by the learned scale
            (or see ``scale``); N = 0 gives an empty output.
        k (Tensor): keys (B, h, n, d), n >= 1 (the same).
        v (Tensor): values (B, h, n, d).
        power (Tensor): the raw exponent parameter (1, h, 1, d).
        alpha (float): the exponent is ``1 + alpha * sigmoid(power)``; finite, in
            (0, ``ALPHA_MAX``] (:func:`check_alpha`). Default: 4.0.
        eps (float | Tensor): added to each normaliser (``sum of scores + n * eps``);
            a positive float, or a tensor broadcastable to (B, h, 1, 1), finite and
            positive everywhere, for one value per batch entry (see the module
            docstring on padded keys). Not differentiated. Default: 1e-6.
        backend (str, optional): 'torch', 'triton' (CUDA tensors, Triton installed,
            head width <= 128) or 'auto' (Triton where it applies, else torch); None
            takes the default of :func:`set_default_backend` ('auto').
        scale (Tensor, optional): a positive, finite (1, h, 1, d) divisor of q and k
            (the modules' ``softplus(scale)``), differentiable: the result of passing
            ``q / scale`` and ``k / scale``, up to rounding. The torch path folds it
            into the features (``log|x| - log(scale)``), so those two tensors are
            neither computed nor kept for the backward pass. Default: None.

    Returns:
        Tensor: (B, h, N, d), the same-signed stream in the first ``ceil(d/2)`` channels
        of every head and the opposite-signed stream in the rest.
    """
    alpha = _check_inputs(q, k, v, power, alpha, eps, scale)
    backend = _resolve_backend(backend, q, k, v)
    if in_graph_capture() and not is_compiling():
        backend = 'torch'  # a trace or an export records the plain formulation
    if backend == 'triton':
        from . import pola_attention_triton
        if scale is not None:
            q, k = q / scale, k / scale
        return pola_attention_triton.pola_linear_attention_triton(q, k, v, power, alpha, eps)
    return _torch_backend(q, k, v, power, alpha, eps, scale)


def _torch_backend(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, eps: EpsType,
                   scale: Optional[Tensor]) -> Tensor:
    """The torch path for checked arguments: half precision, mixed dtypes and calls
    under autocast computed in float32, the result in q's dtype; a graph capture records
    the plain formulation."""
    path = _plain_path if in_graph_capture() else _torch_path
    low_precision = (torch.float16, torch.bfloat16)
    if (q.dtype in low_precision or is_autocast_enabled(q.device.type)
            or not q.dtype == k.dtype == v.dtype):
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
