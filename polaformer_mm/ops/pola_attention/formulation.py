r"""Polarity-aware linear attention (PolaFormer): the method, written once, top to bottom.

:func:`pola_linear_attention_plain` is the specification of the op: every other form
(the blocked autograd Function of :mod:`.function`, the Triton kernels of
:mod:`.triton_backend`, the reference forms of :mod:`.reference`) is tested against the
results it gives, and it is what a graph capture records (a jit trace, an ONNX export with
either exporter, ``torch.compile``, ``torch.export``): plain out-of-place tensor operations,
no autograd Function, no blocks, no Python use of sizes, so that one captured graph serves
any token count.

The method. Inputs are split into heads, ``q`` (B, h, N, d), ``k`` and ``v`` (B, h, n, d),
with q and k already divided by ``softplus(scale)`` or that divisor given as ``scale``.
``power`` is the raw learned (1, h, 1, d) parameter; the exponent of channel j is
:math:`p_j = 1 + \alpha\,\sigma(\text{power}_j) > 1` (:func:`pola_exponent`). The polarity
features of a vector x are :math:`x^+ = \text{relu}(x)^p` and :math:`x^- =
\text{relu}(-x)^p` (element-wise, exponent per channel). For query i and key t the
same-signed score is :math:`s_{it} = q_i^+ \cdot k_t^+ + q_i^- \cdot k_t^-` and the
opposite-signed score :math:`o_{it} = q_i^- \cdot k_t^+ + q_i^+ \cdot k_t^-`. With the
values split as ``torch.chunk(v, 2, -1)`` does (``v1``: the first ``ceil(d/2)`` channels,
:func:`value_split`; ``v2``: the rest) the output of query i is

.. math::

    \text{out}_i = \Big[\frac{\sum_t s_{it} v1_t}{\sum_t s_{it} + n\,\epsilon},\;
                        \frac{\sum_t o_{it} v2_t}{\sum_t o_{it} + n\,\epsilon}\Big]

(B, h, N, d). Both streams are products of :math:`Q = [q^+, q^-]` (N x 2d) with a summary
of the keys, :math:`[K^\top v_c / n, \text{mean}(K)]` for :math:`K = [k^+, k^-]` (the rows
of k+ and k- swapped for the opposite stream), whose last column gives the denominator:
O((N + n) d^2), never an N x n matrix.

Magnitudes. ``relu(q) ** p`` with p up to 1 + alpha overflows float32 for ordinary
magnitudes (|q| = 1e4, p = 5) and float16 far earlier. The output does not change when all
polarity features of one query are multiplied by a positive constant c, or all key
features of one (batch, head), except that ``eps`` then weighs as ``eps / c``. So the
features are computed as :math:`\exp(p \log|x| - M)`, where ``M`` is the largest
:math:`p_j \log|x_j|` of the query row (for keys: of the whole (batch, head)), clamped
below at 0, and ``eps`` is multiplied by :math:`e^{-(M_q + M_k)}`: the quotient is the one
above up to rounding, every feature lies in [0, 1], and exact zeros stay exact zeros (they
never raise ``M``). The features of non-zero inputs and the scaled ``eps`` are kept at or
above the smallest normal number (``torch.finfo(dtype).tiny``; exponents are floored at
:func:`exp_floor`, since ``exp(log(tiny))`` rounds to a subnormal in float32), which keeps
the vectorised CPU ``exp`` off its slow path and 0 / (0 + eps) at 0; next to the row's
largest feature (1 when M > 0) or to ``eps`` (when M = 0) the change is below the rounding
of the output. The gradients at exact zeros are 0 (the slope of ``relu(x) ** p`` at 0).
These are the shared shifts (one per query row, one for the keys of a (batch, head)); the
eager forms add an exact scheme for the rows they lose at large ``alpha``
(:mod:`.exact_scheme`; docs/advanced_guides/method.md, "The exponent's range").

``eps`` may be a float or a tensor broadcastable to (B, h, 1, 1), applied per batch entry
(and head). That serves callers whose keys include padding: zero keys have zero polarity
features and add nothing to the sums, so a call with keys padded by zero rows (k and v set
to exactly zero there) and ``eps * n_real / n`` per entry equals, up to rounding, the call
on the ``n_real`` real keys alone.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from .checks import EpsType

__all__ = ['pola_exponent', 'value_split', 'exp_floor', 'pola_linear_attention_plain']


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


def exp_floor(dtype: torch.dtype) -> float:
    """The smallest exponent the op passes to ``exp``: ``log(tiny) + 1/8``.

    ``exp(log(tiny))`` itself rounds to a subnormal number in float32, and a
    subnormal result sends the vectorised CPU ``exp`` to its slow path (many times
    slower per element); ``exp(floor)`` is 1.13 ``tiny``, a normal number.
    """
    return math.log(torch.finfo(dtype).tiny) + 0.125


def _polarity_features(x: Tensor, p: Tensor, log_scale: Optional[Tensor],
                       per_row: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """``(x+, x-, M)``: the polarity features of ``x / scale`` times ``exp(-M)``, ``M``
    the largest ``p log|x / scale|`` of the row (``per_row``) or of the last two dims, at
    least 0; exponents floored at :func:`exp_floor`.

    The sign is taken as ``x / max(|x|, tiny)`` (the magnitude the logarithm takes):
    ``sign(x)`` but for subnormal ``x``, whose features lie below ``tiny`` either way.
    ``x-`` is ``x+`` minus the signed features, exactly ``relu(-signed)``. Both are
    cheaper in graph runtimes than ``sign`` and a second ``relu`` (one arithmetic pass
    each)."""
    magnitude = torch.abs(x).clamp_min(torch.finfo(x.dtype).tiny)
    scaled = torch.log(magnitude)
    if log_scale is not None:
        scaled = scaled - log_scale
    scaled = scaled * p
    # max over dims, one at a time (ReduceMax of every ONNX opset)
    shift = scaled.max(dim=-1, keepdim=True)[0]
    if not per_row:
        shift = shift.max(dim=-2, keepdim=True)[0]
    shift = shift.clamp_min(0)
    signed = torch.exp((scaled - shift).clamp_min(exp_floor(x.dtype))) * (x / magnitude)
    positive = torch.relu(signed)
    return positive, positive - signed, shift


def _numerator_weights(same: Tensor, other: Tensor, d: int) -> Tensor:
    """The (.., d, d) numerator weights of both streams for the query features of one
    sign, from ``K^T v / n`` of the key features of the same sign (``same``) and of the
    other sign (``other``): the same-signed stream's columns (the first ``ceil(d/2)``
    value channels) against ``same``, the opposite-signed stream's (the rest) against
    ``other``."""
    dv = value_split(d)
    return torch.cat([same[..., :dv], other[..., dv:]], dim=-1)


def _per_channel(numerators: Tensor, denominators: Tensor, d: int) -> Tensor:
    """``numerators`` (.., d) divided by the denominator of their stream
    (``denominators`` (.., 2): the same-signed stream's, then the opposite one's)."""
    dv = value_split(d)
    if 2 * dv == d:  # both streams d / 2 wide: one broadcast division
        shape = numerators.shape[:-1]
        out = numerators.reshape(shape + (2, dv)) / denominators.unsqueeze(-1)
        return out.reshape(shape + (d, ))
    spread = torch.tensor([[1.] * dv + [0.] * (d - dv), [0.] * dv + [1.] * (d - dv)],
                          dtype=numerators.dtype,
                          device=numerators.device)
    return numerators / torch.matmul(denominators, spread)


def pola_linear_attention_plain(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float,
                                eps: EpsType, scale: Optional[Tensor]) -> Tensor:
    """The op (module docstring) in plain tensor operations, for checked arguments
    (:func:`~.checks.check_inputs`) of one floating dtype; autograd differentiates it as
    it stands.

    With ``K = [k+, k-]`` and ``Q = [q+, q-]`` (features scaled by their shifts), stream c
    (its value channels ``v_c``) is ``Q W_c`` with ``W_c = [K^T v_c / n, mean(K)]``, the
    rows of k+ and k- swapped for the opposite stream; the last column is the
    denominator. The products are taken per sign of the features: ``k+^T v / n`` and
    ``k-^T v / n`` and the key means of k+ and k-; every numerator of both streams as
    ``q+ W+ + q- W-`` (W+ the (d, d) rows of the numerator columns that multiply q+, W-
    those that multiply q-), and both denominators likewise from the key means. Graph
    runtimes copy every concatenation and every slice, so no (N, 2d) features, no
    (n, d + 1) values with a column of ones and no slices of one joint (N, d + 2)
    product are written. The same multiply-adds as the eager forms' (``K^T v`` and
    ``Q W``), which FLOP counters of a trace count as the op's.

    Args:
        q (Tensor): queries (B, h, N, d).
        k (Tensor): keys (B, h, n, d).
        v (Tensor): values (B, h, n, d).
        power (Tensor): the raw exponent parameter (1, h, 1, d).
        alpha (float): the exponent is ``1 + alpha * sigmoid(power)``.
        eps (float | Tensor): a float or a tensor broadcastable to (B, h, 1, 1).
        scale (Tensor, optional): the (1, h, 1, d) divisor of q and k, folded into the
            features.

    Returns:
        Tensor: (B, h, N, d).
    """
    if isinstance(eps, Tensor):
        eps = eps.to(q.dtype)
    # the head width: a constant of the graph (a parameter's size), not a traced size
    d = int(power.shape[-1])
    p = pola_exponent(power, alpha)
    log_scale = None if scale is None else torch.log(scale)
    q_pos, q_neg, shift_q = _polarity_features(q, p, log_scale, per_row=True)  # (B, h, N, d)
    k_pos, k_neg, shift_k = _polarity_features(k, p, log_scale, per_row=False)  # (B, h, n, d)
    n = k.shape[-2]
    ones = torch.ones(k.shape[0], k.shape[1], n, 1, dtype=k.dtype, device=k.device)
    # per sign of the key features: K^T v / n (.., d, d) and the key means (.., d, 1),
    # the means as products with a column of ones (a graph runtime's mean over the
    # rows of a (n, d) tensor takes several times longer)
    kv_pos = torch.matmul(k_pos.transpose(-2, -1), v) * (1. / n)
    kv_neg = torch.matmul(k_neg.transpose(-2, -1), v) * (1. / n)
    mean_pos = torch.matmul(k_pos.transpose(-2, -1), ones) * (1. / n)
    mean_neg = torch.matmul(k_neg.transpose(-2, -1), ones) * (1. / n)
    num = (torch.matmul(q_pos, _numerator_weights(kv_pos, kv_neg, d))
           + torch.matmul(q_neg, _numerator_weights(kv_neg, kv_pos, d)))  # (B, h, N, d)
    den = (torch.matmul(q_pos, torch.cat([mean_pos, mean_neg], dim=-1))
           + torch.matmul(q_neg, torch.cat([mean_neg, mean_pos], dim=-1)))  # (B, h, N, 2)
    eps_scaled = torch.exp((-(shift_q + shift_k)).clamp_min(exp_floor(q.dtype)))
    eps_scaled = (eps_scaled * eps).clamp_min(torch.finfo(q.dtype).tiny)
    return _per_channel(num, den + eps_scaled, d)
