"""The exact scheme: shifts for the rows the shared shifts cannot carry.

Exponent range. The shared shifts (:mod:`.shared_shifts`) lose a row when every term of one
of its streams lies far below them: a score is a query feature times a key feature, each
floored near ``tiny``, and with p up to 1 + alpha the exponents of one (batch, head) spread
by ``(1 + alpha)`` times the spread of ``log|x|`` (already at alpha = 50 for keys drawn as
``randn + 1.5``, mostly positive, and queries ``randn``). Each block of queries of the eager
forms therefore checks its denominators; where one is below ``tiny * 2**50`` the block is
computed with this scheme instead. For moderate magnitudes at the usual alpha no block
needs it. What remains is float32 precision: the rounding of ``p log|x|`` grows with p,
which is why :func:`~.checks.check_alpha` refuses ``alpha > ALPHA_MAX``. Below that bound
the output of float32 inputs of moderate magnitude is within 1e-4 of the exact one, and it
is finite for every finite input.

The keys of each channel and sign are shifted by their own largest exponent
(:func:`exact_shifts`, :func:`exact_key_features`), each query row per stream by the largest
exponent it meets there (:func:`exact_query_features`), and ``eps`` is taken into the same
units (:func:`exact_eps`): the largest term of every row and stream is 1 x (a key mean of at
least 1 / n) whatever ``alpha`` and the magnitudes. The blocked autograd Function
(:mod:`.function`) computes such blocks with it; the explicit weights
(:func:`~polaformer_mm.ops.pola_attention_weights`) always do.
"""
import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .checks import EpsType
from .formulation import exp_floor

__all__ = [
    'absent_exponent', 'exact_shifts', 'exact_key_features', 'exact_key_features_for_backward',
    'exact_query_features', 'exact_query_features_for_backward', 'exact_eps'
]


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
    # two reductions: torch.aminmax over tokens is many times slower on the CPU
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
