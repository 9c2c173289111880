"""Explicit attention weights of polarity-aware linear attention, for chosen queries.

:func:`pola_attention_weights` returns, for ``m`` chosen query rows, the weights over
the ``n`` keys with which each polarity stream averages the values (docs/method.md,
section 2, step 10), per head:

* same-signed stream: ``w_sim[t] = (q+ . k+_t + q- . k-_t) / (sum_t (...) + n * eps)``,
  averaging ``v1`` (the first ``ceil(d/2)`` value channels);
* opposite-signed stream: ``w_opp[t] = (q- . k+_t + q+ . k-_t) / (sum_t (...) + n * eps)``,
  averaging ``v2`` (the rest);

with ``x+ = relu(x) ** p``, ``x- = relu(-x) ** p`` and ``p = 1 + alpha * sigmoid(power)``
per head and channel. This is what :func:`~.pola_attention.pola_linear_attention`
computes without forming any weights, written out for ``m`` queries only: the cost is
O(m n d) time and O(m n) memory, never N x n for all queries at once.

Overflow. ``relu(x) ** p`` with p up to ``1 + alpha`` grows quickly, and a score is a sum
of products of two such features. The features are therefore formed in the log domain
and rescaled before any product: every query row by the largest of its 2d features,
every head's keys by their largest feature. A row's weights are unchanged by a common
positive factor of its scores except through the ``n * eps`` term; that term is
rescaled by exactly the same factors (it becomes ``n * eps / (c_q c_k)``), so the result
equals the unscaled formula, and no intermediate exceeds 2d (queries) times n (keys).

Rows sum to ``S / (S + n * eps)`` with ``S`` the row's unnormalised score sum, i.e. to 1
up to ``n * eps / S``; :func:`attention_entropy` renormalises each row to sum to 1.
"""
from typing import Tuple, Union

import torch
from torch import Tensor

__all__ = ['pola_attention_weights', 'pola_exponent', 'attention_entropy']


def pola_exponent(power: Tensor, alpha: float = 4.0) -> Tensor:
    """The learned exponent ``p = 1 + alpha * sigmoid(power)``; ``power = -inf``
    gives exactly ``p = 1``.

    Args:
        power (Tensor): The raw ``power`` parameter of a Pola module, (1, h, 1, d).
        alpha (float): The module's ``alpha``. Default: 4.0.
    """
    return 1 + alpha * torch.sigmoid(power)


def _log_features(x: Tensor, exponent: Tensor) -> Tensor:
    """``log([relu(x) ** p, relu(-x) ** p])`` along the last axis (-inf where a
    feature is 0)."""
    log_magnitude = torch.log(x.abs()) * exponent
    minus_inf = log_magnitude.new_tensor(float('-inf'))
    return torch.cat([
        torch.where(x > 0, log_magnitude, minus_inf),
        torch.where(x < 0, log_magnitude, minus_inf)
    ], dim=-1)


def _finite_or_zero(x: Tensor) -> Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


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
        tuple[Tensor, Tensor]: ``(w_sim, w_opp)``, each (B, h, m, n).
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
    exponent = pola_exponent(power.to(device=q_rows.device, dtype=dtype), alpha)
    if exponent.dim() != 4 or exponent.shape[1] not in (1, h) or exponent.shape[3] not in (
            1, d):
        raise ValueError(f'power shape {tuple(power.shape)} must broadcast to '
                         f'(1,{h},1,{d})')

    log_q = _log_features(q_rows, exponent)  # (B,h,m,2d): [q+, q-]
    log_k = _log_features(k, exponent)  # (B,h,n,2d): [k+, k-]
    q_max = _finite_or_zero(log_q.amax(dim=-1, keepdim=True))  # (B,h,m,1)
    k_max = _finite_or_zero(log_k.amax(dim=(-2, -1), keepdim=True))  # (B,h,1,1)
    q_same = torch.exp(log_q - q_max)  # [q+, q-] / c_q
    q_opposite = torch.cat([q_same[..., d:], q_same[..., :d]], dim=-1)  # [q-, q+]
    keys = torch.exp(log_k - k_max).transpose(-2, -1)  # [k+, k-]^T / c_k

    if not torch.is_tensor(eps):
        eps = torch.tensor(float(eps), dtype=dtype, device=q_rows.device)
    eps = eps.to(device=q_rows.device, dtype=dtype)
    # n * eps in the rescaled units; exp may overflow to inf, which is the limit
    # (the true weights are then below the smallest float of the dtype)
    eps_term = n * eps * torch.exp(-(q_max + k_max))

    weights = []
    for queries in (q_same, q_opposite):
        scores = torch.matmul(queries, keys)  # (B,h,m,n), >= 0
        weights.append(scores / (scores.sum(dim=-1, keepdim=True) + eps_term))
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
