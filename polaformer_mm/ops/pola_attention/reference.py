"""The reference forms of polarity-aware linear attention.

They compute the formula of :mod:`~polaformer_mm.ops.pola_attention.formulation` another
way, for benchmarks and tests:

* :func:`pola_linear_attention_naive`: the order of operations of the official code
  (``relu(x) ** p`` and ``relu(-x) ** p`` separately, each stream its own ``K^T v`` and
  normaliser, autograd through all of it). Benchmarks compare against it. Overflows where
  the powers do.
* :func:`pola_linear_attention_reference`: the explicit N x n weights of both streams,
  which is what the method means. O(N n) memory: tests only. Overflows where the powers
  do.
* :func:`pola_linear_attention_log_domain`: the formula in float64 with every score in
  the log domain, exact to float64 rounding whatever ``alpha`` (no power is formed).
  O(N n d) memory: tests only.
"""
import math
from typing import Tuple

import torch
from torch import Tensor

from .checks import EpsType, check_inputs
from .formulation import pola_exponent, value_split

__all__ = [
    'polarity_features', 'pola_linear_attention_naive', 'pola_linear_attention_reference',
    'pola_linear_attention_log_domain'
]


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
    alpha = check_inputs(q, k, v, power, alpha, eps)
    p = pola_exponent(power, alpha)
    q_pos = torch.relu(q)**p
    q_neg = torch.relu(-q)**p
    k_pos = torch.relu(k)**p
    k_neg = torch.relu(-k)**p
    q_sim = torch.cat([q_pos, q_neg], dim=-1)
    q_opp = torch.cat([q_neg, q_pos], dim=-1)
    keys = torch.cat([k_pos, k_neg], dim=-1)
    n, d1 = keys.shape[-2], value_split(v.shape[-1])
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
    alpha = check_inputs(q, k, v, power, alpha, eps)
    n, d1 = k.shape[-2], value_split(q.shape[-1])
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


def pola_linear_attention_log_domain(q: Tensor,
                                     k: Tensor,
                                     v: Tensor,
                                     power: Tensor,
                                     alpha: float,
                                     eps: EpsType = 1e-6) -> Tensor:
    """The op's formula in float64 with every score in the log domain. Tests only.

    For each (query, key) pair the log of sum_j q_j^p k_j^p over the pairs of channels of
    one stream's signs (a log-sum-exp over the channels), and the normalised weights from
    a log-sum-exp over the keys and ``n * eps``. No power is ever formed, so nothing
    overflows or underflows whatever alpha: exact to float64 rounding (the powers of
    :func:`pola_linear_attention_reference` overflow float64 once p log|x| > 709).
    Arguments are not checked.

    Args:
        q (Tensor): queries (B, h, N, d).
        k (Tensor): keys (B, h, n, d).
        v (Tensor): values (B, h, n, d).
        power (Tensor): the raw exponent parameter (1, h, 1, d).
        alpha (float): the exponent is ``1 + alpha * sigmoid(power)``.
        eps (float | Tensor): as for :func:`pola_linear_attention`. Default: 1e-6.

    Returns:
        Tensor: (B, h, N, d) in float64.
    """
    q, k, v, power = (t.double() for t in (q, k, v, power))
    n, d = k.shape[-2], q.shape[-1]
    d1 = (d + 1) // 2
    p = (1 + alpha * torch.sigmoid(power)).unsqueeze(-2)  # (1, h, 1, 1, d)
    terms = p * (q.abs().log().unsqueeze(-2) + k.abs().log().unsqueeze(-3))  # (B,h,N,n,d)
    signs = q.sign().unsqueeze(-2) * k.sign().unsqueeze(-3)
    eps = torch.as_tensor(eps, dtype=torch.float64).expand(q.shape[0], q.shape[1], 1, 1)
    log_eps = torch.log(n * eps).expand(*q.shape[:3], 1)
    outs = []
    for sign, values in ((1, v[..., :d1]), (-1, v[..., d1:])):
        log_scores = torch.where(signs == sign, terms, -math.inf).logsumexp(dim=-1)  # (B,h,N,n)
        log_total = torch.cat([log_scores, log_eps], dim=-1).logsumexp(dim=-1, keepdim=True)
        outs.append(torch.exp(log_scores - log_total) @ values)
    return torch.cat(outs, dim=-1)
