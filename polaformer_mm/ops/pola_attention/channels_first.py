r"""The op in the channels-first layout of an exported graph: the form an ONNX export of
:class:`~polaformer_mm.models.PolaLinearAttention` records.

The maths is that of :func:`~.formulation.pola_linear_attention_plain` (its module
docstring), rewritten for graph runtimes, which copy the whole tensor at every transpose,
slice and concatenation and run every element-wise operator as its own pass over memory:

* Heads keep their channels before their tokens, (B, h, d, N): the layout of the
  projections ``W x^T`` (C, N), split into heads by a reshape. Every product of the op
  then takes its operands as they lie (``K^T v`` as ``v k^T``, the outputs as ``W^T Q``),
  and the outputs are channels-first maps that the depthwise conv of the values and the
  output projection take without a transpose. No head is ever transposed.
* The polarity features enter through their magnitude and their signed value:
  :math:`e = x^+ + x^- = |x|^p` and :math:`f = x^+ - x^- = \text{sign}(x)\,|x|^p`, so
  that :math:`x^\pm = (e \pm f) / 2` never has to be written. With :math:`A = e_k^\top v
  / n` and :math:`F = f_k^\top v / n`, the numerators of both streams are
  :math:`(e_q A + f_q F S) / 2` (``S`` the signs +1 for the same-signed stream's value
  channels, -1 for the opposite stream's), and their denominators
  :math:`(e_q \bar e_k \pm f_q \bar f_k) / 2` (bars: key means): two products with
  (d + 2, d) weights give both, laid out as (2 streams, value channels + denominator).
* Padding keys are given by ``key_weights`` (0 for padding, 1 for a real key) rather
  than by zero keys: the key means are products with that column, and the caller passes
  values that are zero there (as the depthwise conv of the values needs them anyway), so
  ``K^T v`` needs no weights and the keys need no pass of their own.

Shifts and floors are those of the plain formulation: ``M`` the largest ``p log|x|`` of
a query (over its d channels) or of the keys of a (batch, head), at least 0; exponents
floored at :func:`~.formulation.exp_floor`; ``eps`` times :math:`e^{-(M_q + M_k)}`, at
least ``tiny``. The one difference: a zero input has magnitude ``exp(floor)`` (1.13
``tiny``) where the plain form has 0 (its signed value is 0 in both), which changes no
sum it joins beyond rounding. The export tests compare this form, run by onnxruntime,
with the eager model; the op tests compare it with the plain formulation.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from .checks import EpsType
from .formulation import exp_floor, pola_exponent, value_split

__all__ = ['pola_linear_attention_channels_first', 'channel_max', 'channel_split']


def channel_split(d: int) -> int:
    """The largest divisor of ``d`` that is at most its square root (1 for a prime)."""
    return max(a for a in range(1, math.isqrt(d) + 1) if d % a == 0)


def channel_max(x: Tensor, d: int) -> Tensor:
    """The largest entry over the ``d`` channels (dim -2) of channels-first ``x``
    (B, h, d, T): (B, h, 1, T), exactly ``x.max(dim=-2, keepdim=True)[0]``.

    Taken in two reductions of a reshape to (B, h, a, b, T) (``d = a b``,
    :func:`channel_split`), over its b and then its a channels: onnxruntime reduces the
    middle axis of a tensor with nothing before it to work on side by side (one batch
    entry and one head, as in the first stage of the pyramid backbones) many times slower than
    the same values split into a groups."""
    a = channel_split(d)
    if a == 1:
        return x.max(dim=-2, keepdim=True)[0]
    parts = x.reshape(x.shape[0], x.shape[1], a, d // a, -1).max(dim=3)[0]  # (B, h, a, T)
    return parts.max(dim=2, keepdim=True)[0]


def _magnitude_and_signed(x: Tensor, p: Tensor, per_row: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """``(e, f, M)`` for channels-first ``x`` (B, h, d, T) and the exponent ``p``
    (1, h, d, 1): ``e = |x|^p exp(-M)``, ``f = sign(x) e`` (the sign as ``x / |x|``,
    ``|x|`` at least ``tiny``), ``M`` the largest ``p log|x|`` of each token
    (``per_row``, (B, h, 1, T): :func:`channel_max`) or of the whole (batch, head)
    ((B, h, 1, 1): over the tokens first, the contiguous axis), at least 0."""
    magnitude = torch.abs(x).clamp_min(torch.finfo(x.dtype).tiny)
    scaled = torch.log(magnitude) * p
    if per_row:
        shift = channel_max(scaled, int(p.shape[-2]))
    else:
        shift = scaled.max(dim=-1, keepdim=True)[0].max(dim=-2, keepdim=True)[0]
    shift = shift.clamp_min(0)
    e = torch.exp((scaled - shift).clamp_min(exp_floor(x.dtype)))
    return e, e * (x / magnitude), shift


def _stream_rows(weights: Tensor, means: Tensor, signs: Tuple[float, float], d: int) -> Tensor:
    """The (.., d + 2, d) left factor of one kind of query feature: the rows of
    ``weights`` (.., d, d) (value channel x feature channel) for the same-signed stream,
    then ``signs[0] * means`` (.., 1, d), then the opposite stream's rows, then
    ``signs[1] * means``."""
    dv = value_split(d)
    return torch.cat(
        [weights[..., :dv, :], means * signs[0], weights[..., dv:, :], means * signs[1]], dim=-2)


def pola_linear_attention_channels_first(q: Tensor,
                                         k: Tensor,
                                         v: Tensor,
                                         power: Tensor,
                                         alpha: float,
                                         eps: EpsType,
                                         key_weights: Optional[Tensor] = None) -> Tensor:
    """The op on channels-first heads (module docstring); plain tensor operations.

    Args:
        q (Tensor): queries (B, h, d, N), already divided by ``softplus(scale)``.
        k (Tensor): keys (B, h, d, n), likewise divided.
        v (Tensor): values (B, h, d, n); zero where ``key_weights`` is.
        power (Tensor): the raw exponent parameter (1, h, 1, d).
        alpha (float): the exponent is ``1 + alpha * sigmoid(power)``.
        eps (float | Tensor): a float or a tensor broadcastable to (B, h, 1, 1).
        key_weights (Tensor, optional): (B, 1, n, 1), 1 for a real key and 0 for
            padding: the key means are taken with these weights (still divided by n,
            so ``eps`` must be scaled by ``n_real / n`` as for the plain op). None: every
            key is real.

    Returns:
        Tensor: (B, h, d, N), in q's dtype; half precision and mixed dtypes are computed
        in float32, as :func:`~polaformer_mm.ops.pola_linear_attention` computes them.
    """
    if q.dtype in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype:
        out = _attend(q.float(), k.float(), v.float(), power.float(), alpha, eps,
                      None if key_weights is None else key_weights.float())
        return out.to(q.dtype)
    return _attend(q, k, v, power, alpha, eps, key_weights)


def _attend(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, eps: EpsType,
            key_weights: Optional[Tensor]) -> Tensor:
    """:func:`pola_linear_attention_channels_first` in one floating dtype."""
    B, h, d, N = q.shape
    n = k.shape[-1]
    dv = value_split(d)
    p = pola_exponent(power, alpha).transpose(-2, -1)  # (1, h, d, 1)
    q_e, q_f, shift_q = _magnitude_and_signed(q, p, per_row=True)
    k_e, k_f, shift_k = _magnitude_and_signed(k, p, per_row=False)
    if key_weights is None:
        key_weights = torch.ones(k.shape[0], 1, n, 1, dtype=k.dtype, device=k.device)
    # K^T v / 2n with the value channels as rows: (.., d, d)
    weights_e = torch.matmul(v, k_e.transpose(-2, -1)) * (0.5 / n)
    weights_f = torch.matmul(v, k_f.transpose(-2, -1)) * (0.5 / n)
    signs = torch.tensor([1.] * dv + [-1.] * (d - dv), dtype=q.dtype, device=q.device)
    weights_f = weights_f * signs.view(d, 1)
    # key means / 2 as rows: (.., 1, d)
    means_e = torch.matmul(k_e, key_weights).transpose(-2, -1) * (0.5 / n)
    means_f = torch.matmul(k_f, key_weights).transpose(-2, -1) * (0.5 / n)
    # (.., d + 2, N): the same-signed stream's numerators and denominator, then the
    # opposite stream's
    joint = (
        torch.matmul(_stream_rows(weights_e, means_e, (1., 1.), d), q_e)
        + torch.matmul(_stream_rows(weights_f, means_f, (1., -1.), d), q_f))
    if isinstance(eps, Tensor):
        eps = eps.to(q.dtype)
    eps_scaled = torch.exp((-(shift_q + shift_k)).clamp_min(exp_floor(q.dtype)))
    eps_scaled = (eps_scaled * eps).clamp_min(torch.finfo(q.dtype).tiny)  # (B, h, 1, N)
    if 2 * dv == d:  # both streams d / 2 wide: one broadcast division
        joint = joint.reshape(B, h, 2, dv + 1, N)
        out = joint[:, :, :, :dv] / (joint[:, :, :, dv:] + eps_scaled.unsqueeze(2))
        return out.reshape(B, h, d, N)
    same = joint[:, :, :dv] / (joint[:, :, dv:dv + 1] + eps_scaled)
    opposite = joint[:, :, dv + 1:d + 1] / (joint[:, :, d + 1:] + eps_scaled)
    return torch.cat([same, opposite], dim=2)
