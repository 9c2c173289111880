"""The shared shifts: the scaled polarity features of the eager forms, in place.

One shift per query row and one for all keys of a (batch, head), as in
:func:`~.formulation.pola_linear_attention_plain` (the same features, floors and scaled
``eps``), here written into preallocated planes (2, ...) that also serve as scratch space:
:func:`scaled_features` (with :func:`scaled_features_for_backward`, which also returns what
the gradients need), :func:`scaled_eps`, and :func:`shared_shifts_lose_rows`, which tells
when some row's terms all lie far below these shifts (then the exact scheme of
:mod:`.exact_scheme` takes it). The blocked autograd Function (:mod:`.function`) and the
Triton backend use them.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .checks import EpsType
from .formulation import exp_floor

__all__ = [
    'scaled_features', 'scaled_features_for_backward', 'scaled_eps', 'shared_shifts_lose_rows'
]


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
