"""Explicit attention weights of polarity-aware linear attention, for chosen queries.

:func:`pola_attention_weights` returns, for ``m`` chosen query rows, the weights over
the ``n`` keys with which each polarity stream averages the values
(docs/advanced_guides/method.md, section 2, step 10), per head:

* same-signed stream: ``w_sim[t] = (q+ . k+_t + q- . k-_t) / (sum_t (...) + n * eps)``,
  averaging ``v1`` (the first ``ceil(d/2)`` value channels);
* opposite-signed stream: ``w_opp[t] = (q- . k+_t + q+ . k-_t) / (sum_t (...) + n * eps)``,
  averaging ``v2`` (the rest);

with ``x+ = relu(x) ** p``, ``x- = relu(-x) ** p`` and ``p = 1 + alpha * sigmoid(power)``
per head and channel. This is what :func:`~.pola_attention.pola_linear_attention`
computes without forming any weights, written out for ``m`` queries only: the cost is
O(m n d) time and O(m n) memory, never N x n for all queries at once.

Overflow. ``relu(x) ** p`` with p up to ``1 + alpha`` grows quickly, and a score is a sum
of products of two such features. The features are therefore those of the op's exact
scheme, formed in the log domain: the keys of each channel and sign divided by their
largest feature, each query row, per stream, by the largest feature it meets there, so
that the largest term of every row is 1 whatever ``alpha`` and the magnitudes. A row's
weights are unchanged by a common positive factor of its scores except through the
``n * eps`` term, which is rescaled by exactly the same factor, as the op does, so the
result equals the unscaled formula.

Rows sum to ``S / (S + n * eps)`` with ``S`` the row's unnormalised score sum, i.e. to 1
up to ``n * eps / S``; :func:`attention_entropy` renormalises each row to sum to 1.
"""
from typing import Tuple, Union

import torch
from torch import Tensor

from .pola_attention.checks import check_alpha
from .pola_attention.exact_scheme import (exact_eps, exact_key_features, exact_query_features,
                                          exact_shifts)
from .pola_attention.formulation import pola_exponent

__all__ = ['pola_attention_weights', 'attention_entropy']


def pola_attention_weights(q_rows: Tensor,
                           k: Tensor,
                           power: Tensor,
                           alpha: float = 4.0,
                           eps: Union[float, Tensor] = 1e-6) -> Tuple[Tensor, Tensor]:
    """Weights of both polarity streams over the keys, for the given queries only.

    The arguments are those of :func:`~.pola_attention.pola_linear_attention` (the
    tensors :meth:`PolaLinearAttention.project` returns) with the queries restricted to
    the rows of interest. Computed in the dtype of ``q_rows`` (use float64 for
    comparisons at 1e-6 and better); see the module docstring for the overflow guard.

    Args:
        q_rows (Tensor): Queries (B, h, m, d), already divided by ``softplus(scale)``.
        k (Tensor): Keys (B, h, n, d), as the op receives them (keys of padded tokens
            are zero and get zero weight).
        power (Tensor): The raw ``power`` parameter, broadcastable to (1, h, 1, d);
            ``-inf`` everywhere gives the exponent 1.
        alpha (float): Exponent range: ``p = 1 + alpha * sigmoid(power)``. Default: 4.0.
        eps (float | Tensor): The op's ``eps``; a tensor broadcastable to (B, 1, 1, 1)
            for a per-entry value (windows with padding). Default: 1e-6.

    Returns:
        tuple[Tensor, Tensor]: ``(w_sim, w_opp)``, each (B, h, m, n), without
        gradients (for analysis; the op itself is what training differentiates).
    """
    if q_rows.dim() != 4 or k.dim() != 4:
        raise ValueError('pola_attention_weights expects q_rows (B,h,m,d) and k '
                         f'(B,h,n,d); got {tuple(q_rows.shape)} and {tuple(k.shape)}')
    B, h, _, d = q_rows.shape
    if k.shape[0] != B or k.shape[1] != h or k.shape[3] != d:
        raise ValueError(f'k shape {tuple(k.shape)} does not match q_rows shape '
                         f'{tuple(q_rows.shape)} (expected (B,h,n,d))')
    n = k.shape[2]
    if n == 0:
        raise ValueError('pola_attention_weights got zero keys (n == 0)')
    dtype = q_rows.dtype
    k = k.to(dtype)
    exponent = pola_exponent(power.to(device=q_rows.device, dtype=dtype), check_alpha(alpha))
    if exponent.dim() != 4 or exponent.shape[1] not in (1, h) or exponent.shape[3] not in (1, d):
        raise ValueError(f'power shape {tuple(power.shape)} must broadcast to '
                         f'(1,{h},1,{d})')

    # the op's exact scheme: key features shifted per channel and sign, query features
    # per row and stream, and eps in the same units
    if torch.is_tensor(eps):
        eps = eps.detach().to(device=q_rows.device, dtype=dtype)
    with torch.no_grad():
        shifts = exact_shifts(k, exponent, None)
        k_planes = exact_key_features(k, exponent, shifts, None).transpose(-2, -1)  # (2,B,h,d,n)
        weights = []
        for stream, (q_planes,
                     shift) in enumerate(exact_query_features(q_rows, exponent, shifts, None)):
            same, other = (0, 1) if stream == 0 else (1, 0)
            scores = (torch.matmul(q_planes[0], k_planes[same])
                      + torch.matmul(q_planes[1], k_planes[other]))  # (B,h,m,n), >= 0
            weights.append(scores / (scores.sum(dim=-1, keepdim=True) + n * exact_eps(eps, shift)))
    return weights[0], weights[1]


def attention_entropy(weights: Tensor, dim: int = -1) -> Tensor:
    """Entropy (nats) of every attention row, each renormalised to sum to 1.

    A row over ``n`` keys has an entropy in ``[0, log n]``; keys of zero weight
    (padding) add nothing. Rows whose weights are all zero have no distribution and
    give NaN.

    Args:
        weights (Tensor): Non-negative weights, the keys along ``dim``.
        dim (int): The key axis. Default: -1.
    """
    total = weights.sum(dim=dim, keepdim=True)
    probs = weights / total
    return -torch.special.xlogy(probs, probs).sum(dim=dim)
