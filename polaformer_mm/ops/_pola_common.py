"""What every form of polarity-aware linear attention shares: the argument checks, the
exponent, the value split, the scaled features of both shift schemes and the key summary.

Imported by the dispatch (:mod:`polaformer_mm.ops.pola_attention`), both backends
(:mod:`~polaformer_mm.ops.pola_attention_torch`, :mod:`~polaformer_mm.ops.pola_attention_triton`),
the naive and reference forms (:mod:`~polaformer_mm.ops.pola_attention_naive`) and the
explicit weights (:mod:`~polaformer_mm.ops.attention_weights`); it imports none of them.
The maths and its notation are those of :mod:`polaformer_mm.ops.pola_attention`.

Two shift schemes keep every feature in [0, 1] whatever the exponent:

* the shared shifts (:func:`scaled_features`): one per query row, one for all keys of a
  (batch, head); what the torch path and the Triton kernels take for almost every input;
* the exact scheme (:func:`exact_shifts`, :func:`exact_key_features`,
  :func:`exact_query_features`): the keys of each channel and sign shifted by their own
  largest exponent, each query row per stream by the largest exponent it meets there,
  for the rows the shared shifts lose (:func:`shared_shifts_lose_rows`).
"""
import math
import numbers
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from ..utils.compat import in_graph_capture

__all__ = [
    'ALPHA_MAX', 'EpsType', 'check_alpha', 'check_inputs', 'pola_exponent', 'value_split',
    'exp_floor', 'absent_exponent', 'scaled_features', 'scaled_features_for_backward', 'scaled_eps',
    'assemble_summary', 'summary_grads', 'shared_shifts_lose_rows', 'exact_shifts',
    'exact_key_features', 'exact_key_features_for_backward', 'exact_query_features',
    'exact_query_features_for_backward', 'exact_eps'
]

#: ``eps=`` of every form: a positive float, or a tensor broadcastable to (B, h, 1, 1).
EpsType = Union[float, Tensor]

#: The largest ``alpha`` the op takes (:func:`check_alpha` says why).
ALPHA_MAX = 100.0

# --------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------


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
    """A ValueError unless q, k, v and ``power`` are floating point on q's device, and
    q, k and v all float64 or none of them."""
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


def _check_eps(eps: EpsType, B: int, h: int) -> None:
    """A ValueError unless ``eps`` is a finite float > 0 or a constant tensor of such
    values broadcastable to (B, h, 1, 1)."""
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


def check_inputs(q: Tensor,
                 k: Tensor,
                 v: Tensor,
                 power: Tensor,
                 alpha,
                 eps: EpsType,
                 scale: Optional[Tensor] = None) -> float:
    """A ValueError naming the argument unless the arguments of
    :func:`~polaformer_mm.ops.pola_linear_attention` (or of its naive and reference forms,
    without ``scale``) fit together; returns ``alpha`` as a float (:func:`check_alpha`).

    Args:
        q (Tensor): queries (B, h, N, d).
        k (Tensor): keys (B, h, n, d), n >= 1.
        v (Tensor): values, k's shape.
        power (Tensor): (1, h, 1, d).
        alpha: the exponent's range.
        eps (float | Tensor): a float > 0 or a tensor broadcastable to (B, h, 1, 1).
        scale (Tensor, optional): a positive (1, h, 1, d) divisor of q and k.

    Returns:
        float: ``alpha``.
    """
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
    _check_eps(eps, B, h)
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


# --------------------------------------------------------------------------------------
# the exponent and the value split
# --------------------------------------------------------------------------------------


def pola_exponent(power: Tensor, alpha: float = 4.0) -> Tensor:
    """The learned exponent ``p = 1 + alpha * sigmoid(power)`` (``power = -inf`` gives
    exactly ``p = 1``).

    Args:
        power (Tensor): The raw ``power`` parameter of a Pola module, (1, h, 1, d).
        alpha (float): The module's ``alpha``. Default: 4.0.
    """
    return 1 + alpha * torch.sigmoid(power)


def value_split(d: int) -> int:
    """The value channels of the same-signed stream, ``ceil(d / 2)``: the first part of
    ``torch.chunk(v, 2, dim=-1)`` (which takes the larger half); the opposite stream
    takes the rest."""
    return (d + 1) // 2


# --------------------------------------------------------------------------------------
# the shared shifts
# --------------------------------------------------------------------------------------


def exp_floor(dtype: torch.dtype) -> float:
    """The smallest exponent the op passes to ``exp``: ``log(tiny) + 1/8``.

    ``exp(log(tiny))`` itself rounds to a subnormal number in float32, and a
    subnormal result sends the vectorised CPU ``exp`` to its slow path (about 50
    times slower per element); ``exp(floor)`` is 1.13 ``tiny``, a normal number.
    """
    return math.log(torch.finfo(dtype).tiny) + 0.125


def _scaled_features(x: Tensor, p: Tensor, per_row: bool, shift: Optional[Tensor],
                     log_scale: Optional[Tensor], magnitude: Optional[Tensor]):
    """The work of :func:`scaled_features`: ``(planes, shift, scaled log)``. Without
    ``magnitude`` the log is computed in the positive plane (its scratch space) and
    the third value is None; with it (``max(|x|, tiny)``) in a tensor of its own."""
    feats = x.new_empty((2, ) + x.shape)
    pos, neg = feats[0], feats[1]
    if magnitude is None:
        scaled = torch.abs(x, out=pos).clamp_min_(torch.finfo(x.dtype).tiny).log_()
    else:
        scaled = torch.log(magnitude)
    if log_scale is not None:
        scaled.sub_(log_scale)
    scaled.mul_(p)
    if shift is None:
        dims = (-1, ) if per_row else (-2, -1)
        shift = scaled.amax(dim=dims, keepdim=True).clamp_min_(0)
    torch.sub(scaled, shift, out=pos).clamp_min_(exp_floor(x.dtype)).exp_()
    torch.sign(x, out=neg)
    pos.mul_(neg)  # +-feature, 0 at x == 0
    return feats, shift, (None if magnitude is None else scaled)


def _split_signs(feats: Tensor) -> Tensor:
    """Planes (2, ...) holding the signed feature in plane 0 into ``[x+, x-]``."""
    pos, neg = feats[0], feats[1]
    torch.neg(pos, out=neg).clamp_min_(0)
    pos.clamp_min_(0)
    return feats


def scaled_features(x: Tensor,
                    p: Tensor,
                    per_row: bool,
                    shift: Optional[Tensor] = None,
                    log_scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The features ``[x+, x-] * exp(-M)`` as two planes (2, ...) and the shift ``M``.

    ``M`` is max(0, max p log|x|) over the row (``per_row``) or over the last two dims,
    unless given. A feature is ``exp(max(p log max(|x|, tiny) - M, floor))`` (floor:
    :func:`exp_floor`) on the channel's own polarity (sign of x) and 0 on the other;
    with ``log_scale`` (broadcastable to x), ``log|x|`` is replaced by
    ``log|x| - log_scale``: the features of ``x / scale``. Exact zeros give zero
    features and never raise ``M`` above 0, and no ``log`` or ``exp`` sees 0, inf or a
    result below the smallest normal number (the slow paths of the vectorised CPU
    kernels). The planes are contiguous and serve as scratch space, so that the only
    memory allocated is theirs.

    Returns:
        tuple[Tensor, Tensor]: the planes ``[x+, x-]`` (2, ...) and ``M``.
    """
    feats, shift, _ = _scaled_features(x, p, per_row, shift, log_scale, None)
    return _split_signs(feats), shift


def scaled_features_for_backward(
        x: Tensor,
        p: Tensor,
        per_row: bool,
        shift: Optional[Tensor] = None,
        log_scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`scaled_features` with what the gradients of x, p and ``log_scale`` need.

    Returns:
        tuple[Tensor, Tensor, Tensor, Tensor]: the planes and ``M`` of
        :func:`scaled_features`, ``p (log max(|x|, tiny) - log_scale)`` and
        ``sign(x) / max(|x|, tiny)`` (0 at x == 0).
    """
    magnitude = torch.abs(x).clamp_min_(torch.finfo(x.dtype).tiny)
    feats, shift, scaled = _scaled_features(x, p, per_row, shift, log_scale, magnitude)
    inv_x = magnitude.reciprocal_().mul_(feats[1])  # plane 1 holds sign(x) here
    return _split_signs(feats), shift, scaled, inv_x


def scaled_eps(eps: EpsType, shift_q: Tensor, shift_k: Tensor) -> Tensor:
    """``eps * exp(-(M_q + M_k))`` (B,h,N,1): the eps of the scaled features, at least
    the smallest normal number (so that 1 / eps is finite)."""
    tiny = torch.finfo(shift_q.dtype).tiny
    factor = torch.add(shift_q, shift_k).neg_().clamp_min_(exp_floor(shift_q.dtype)).exp_()
    return factor.mul_(eps).clamp_min_(tiny)


def shared_shifts_lose_rows(inv_den: Tensor) -> bool:
    """Whether the shared shifts lose some row: some denominator (reciprocal in
    ``inv_den``) below ``tiny * 2**50``.

    Above that the terms the shared shifts floor or flush (each under ``tiny``, at most
    ``4 d`` of them per row and stream) change a result by less than ``4 d * 2**-50``
    relative; below it they may be all there is (the row's terms all far below the
    shifts). Reads the answer back from the device.
    """
    limit = 1 / (torch.finfo(inv_den.dtype).tiny * 2.0**50)
    return bool((inv_den > limit).any())


# --------------------------------------------------------------------------------------
# the key summary W
# --------------------------------------------------------------------------------------


def assemble_summary(kv: Tensor, k_mean: Tensor) -> Tensor:
    """W (..., 2d, d+2) from ``[k+, k-]^T v / n`` (..., 2d, d) and the key means (..., 2d).

    Rows 0..d-1 multiply q+ and rows d..2d-1 multiply q-; columns: the numerators of the
    same-signed stream (v1 channels), of the opposite stream (v2 channels), then the
    denominators of both streams.
    """
    d = kv.shape[-1]
    d1 = value_split(d)
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


def summary_grads(gW: Tensor, d: int) -> Tuple[Tensor, Tensor]:
    """Gradients of [k+, k-]^T v / n (2d, d) and of the key means (2d,) from that of W
    (:func:`assemble_summary`)."""
    d1 = value_split(d)
    g_kv = gW.new_empty(gW.shape[:-1] + (d, ))
    g_kv[..., :d1] = gW[..., :d1]
    g_kv[..., d:, d1:] = gW[..., :d, d1:d]
    g_kv[..., :d, d1:] = gW[..., d:, d1:d]
    g_mean = gW[..., d].clone()
    g_mean[..., :d] += gW[..., d:, d + 1]
    g_mean[..., d:] += gW[..., :d, d + 1]
    return g_kv, g_mean


# --------------------------------------------------------------------------------------
# the exact scheme, for the rows the shared shifts cannot carry
# --------------------------------------------------------------------------------------


def absent_exponent(dtype: torch.dtype) -> float:
    """A finite stand-in for an infinite exponent (a sign that no key of a channel has,
    an exact zero): ``finfo.max / 16``, so that sums of a few of them stay finite and
    products with the 0 / 1 sign masks stay exact (``0 * inf`` would be NaN)."""
    return torch.finfo(dtype).max / 16


def exact_shifts(k: Tensor, p: Tensor, log_scale: Optional[Tensor]) -> Tensor:
    """``c`` (2, B, h, 1, d): the largest ``p (log|k| - log_scale)`` among the positive
    keys (``c[0]``) and among the negative keys (``c[1]``) of each channel and (batch,
    head); ``-absent_exponent`` (:func:`absent_exponent`) where a channel has no key of
    that sign."""
    # two reductions: torch.aminmax over tokens is about 10 times slower on the CPU
    high, low = k.amax(dim=-2, keepdim=True), k.amin(dim=-2, keepdim=True).neg_()
    extremes = torch.stack([high, low])
    shifts = extremes.clamp_min(torch.finfo(k.dtype).tiny).log_()
    if log_scale is not None:
        shifts.sub_(log_scale)
    return shifts.mul_(p).masked_fill_(extremes <= 0, -absent_exponent(k.dtype))


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


def _exact_key_features(k: Tensor, p: Tensor, shifts: Tensor,
                        log_scale: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The work of :func:`exact_key_features`: the planes, the scaled log, the
    magnitude and ``sign(k)``."""
    scaled, magnitude = _scaled_log(k, p, log_scale)
    sign, positive, negative = _sign_masks(k)
    exponent = torch.addcmul(scaled, positive, shifts[0], value=-1)
    exponent.addcmul_(negative, shifts[1], value=-1).clamp_min_(_exact_floor(k.dtype)).exp_()
    feats = torch.stack([exponent.mul(positive), exponent.mul_(negative)])
    return feats, scaled, magnitude, sign


def exact_key_features(k: Tensor, p: Tensor, shifts: Tensor, log_scale: Optional[Tensor]) -> Tensor:
    """Key feature planes (2, ...) with each channel and sign shifted by its own largest
    exponent ``c`` (:func:`exact_shifts`): every non-zero feature lies in (0, 1] and
    the largest of each channel and sign is 1."""
    return _exact_key_features(k, p, shifts, log_scale)[0]


def exact_key_features_for_backward(k: Tensor, p: Tensor, shifts: Tensor,
                                    log_scale: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`exact_key_features` with what the gradients need:
    ``(planes, p (log max(|k|, tiny) - log_scale), sign(k) / max(|k|, tiny))``."""
    feats, scaled, magnitude, sign = _exact_key_features(k, p, shifts, log_scale)
    return feats, scaled, magnitude.reciprocal_().mul_(sign)


def _exact_query_features(q: Tensor, p: Tensor, shifts: Tensor, log_scale: Optional[Tensor]):
    """The work of :func:`exact_query_features`: the streams, the scaled log, the
    magnitude and ``sign(q)``."""
    scaled, magnitude = _scaled_log(q, p, log_scale)
    sign, positive, negative = _sign_masks(q)
    # exact zeros: an exponent far below any other, so that they never set M
    base = torch.addcmul(scaled, positive + negative - 1,
                         scaled.new_tensor(absent_exponent(q.dtype)))
    floor = _exact_floor(q.dtype)
    streams = []
    for c_pos, c_neg in ((shifts[0], shifts[1]), (shifts[1], shifts[0])):
        exponent = torch.addcmul(base, positive, c_pos).addcmul_(negative, c_neg)
        shift = exponent.amax(dim=-1, keepdim=True)
        feature = exponent.sub_(shift).clamp_min_(floor).exp_()
        streams.append((torch.stack([feature.mul(positive), feature.mul_(negative)]), shift))
    return streams, scaled, magnitude, sign


def exact_query_features(q: Tensor, p: Tensor, shifts: Tensor,
                         log_scale: Optional[Tensor]) -> List[Tuple[Tensor, Tensor]]:
    """Per stream (same-signed, then opposite) the query feature planes (2, ...) of the
    exact scheme and their row shift ``M`` (..., 1).

    A query feature meets, in each stream, the keys of one sign per channel, whose
    features :func:`exact_key_features` shifts by that channel and sign's ``c``: the
    same-signed stream pairs a positive q with ``c[0]`` and a negative one with
    ``c[1]``, the opposite stream the other way round. Per row and stream the
    features are therefore ``exp(p log|q| + c - M)`` with ``M`` the row's largest
    ``p log|q| + c`` in that stream (exact zeros left out), so that every (query
    feature) x (key feature) product is the unscaled one times ``exp(-M)``, and the
    largest term of every row and stream is (largest feature 1) x (a key feature 1),
    whatever ``alpha`` and the magnitudes. ``M`` and ``c`` are constants of the
    derivative: the output does not depend on them.
    """
    return _exact_query_features(q, p, shifts, log_scale)[0]


def exact_query_features_for_backward(
        q: Tensor, p: Tensor, shifts: Tensor,
        log_scale: Optional[Tensor]) -> Tuple[List[Tuple[Tensor, Tensor]], Tensor, Tensor]:
    """:func:`exact_query_features` with what the gradients need: ``(streams,
    p (log max(|q|, tiny) - log_scale), sign(q) / max(|q|, tiny))``."""
    streams, scaled, magnitude, sign = _exact_query_features(q, p, shifts, log_scale)
    return streams, scaled, magnitude.reciprocal_().mul_(sign)


def exact_eps(eps: EpsType, shift: Tensor) -> Tensor:
    """``eps * exp(-M)``, the eps of the exact scheme's units, kept in [tiny, 1 / tiny]
    (outside, eps or the scores are negligible against the other)."""
    info = torch.finfo(shift.dtype)
    factor = shift.neg().clamp_(exp_floor(shift.dtype), -math.log(info.tiny)).exp_()
    return factor.mul_(eps).clamp_(info.tiny, 1 / info.tiny)
