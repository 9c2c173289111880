"""Polarity-aware linear attention maths (DESIGN.md section 1, steps 6-11).

Inputs are already divided by ``softplus(scale)`` (step 4) and split into heads:
``q`` (B, h, N, d), ``k`` and ``v`` (B, h, n, d). ``power`` is the raw learned (1, h, 1, d)
parameter; the exponent is ``p = 1 + alpha * sigmoid(power)``.

Two implementations:

* :func:`pola_linear_attention` is the fast path. Both polarity streams are products of
  ``[q+, q-]`` (N x 2d) with matrices built from the keys, so it forms one (2d x d) key-value
  summary ``[k+, k-]^T v / n`` plus the two (2d,) key means, rearranges them into a single
  (2d x (d + 2)) matrix and multiplies it with ``[q+, q-]`` once. Nothing of size N x n is formed.
* :func:`pola_linear_attention_reference` builds the explicit N x n attention weights of both
  streams (``q_sim K^T`` and ``q_opp K^T``, row-normalised), which is what the method means;
  it costs O(N n) memory and is meant for tests only.
"""
from typing import Tuple

import torch
from torch import Tensor

__all__ = [
    'pola_linear_attention', 'pola_linear_attention_reference',
    'polarity_features'
]


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, power: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            'pola_linear_attention expects q (B,h,N,d), k (B,h,n,d) and v '
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
    if power.dim() != 4 or power.shape[1] != h or power.shape[3] != d:
        raise ValueError(f'power shape {tuple(power.shape)} must be (1,{h},1,{d})')


def polarity_features(x: Tensor, exponent: Tensor) -> Tuple[Tensor, Tensor]:
    """Return ``(relu(x) ** p, relu(-x) ** p)`` for a broadcastable exponent p > 0.

    Both come from one power of ``|x|`` (the power and its gradient are the costly
    part): the positive part keeps it where x > 0, the negative part is the rest.
    """
    magnitude = x.abs()**exponent
    positive = torch.where(x > 0, magnitude, 0.)
    return positive, magnitude - positive


def _polarity_maps(q: Tensor, k: Tensor, power: Tensor,
                   alpha: float) -> Tuple[Tensor, Tensor, Tensor]:
    """Steps 6-7: q+, q- (B,h,N,d) and the keys [k+, k-] (B,h,n,2d)."""
    p = 1 + alpha * torch.sigmoid(power)
    q_pos, q_neg = polarity_features(q, p)
    return q_pos, q_neg, torch.cat(polarity_features(k, p), dim=-1)


def _value_split(d: int) -> Tuple[int, int]:
    # torch.chunk(v, 2, dim=-1) semantics: the first part takes the larger half.
    first = (d + 1) // 2
    return first, d - first


def pola_linear_attention(q: Tensor,
                          k: Tensor,
                          v: Tensor,
                          power: Tensor,
                          alpha: float = 4.0,
                          eps: float = 1e-6) -> Tensor:
    """Polarity-aware linear attention without any N x n matrix.

    Returns (B, h, N, d): the same-signed stream in the first ``ceil(d/2)`` channels
    of every head and the opposite-signed stream in the rest.

    Half-precision inputs (and calls under autocast) are computed in float32 and the
    result cast back: ``relu(q) ** p`` with p up to 1 + alpha overflows float16.
    """
    _check_inputs(q, k, v, power)
    low_precision = (torch.float16, torch.bfloat16)
    if q.dtype in low_precision or torch.is_autocast_enabled(q.device.type):
        with torch.autocast(q.device.type, enabled=False):
            out = _pola_linear_attention(q.float(), k.float(), v.float(),
                                         power.float(), alpha, eps)
        return out.to(q.dtype)
    return _pola_linear_attention(q, k, v, power, alpha, eps)


def _pola_linear_attention(q: Tensor, k: Tensor, v: Tensor, power: Tensor,
                           alpha: float, eps: float) -> Tensor:
    d, n, d1 = q.shape[-1], k.shape[-2], _value_split(q.shape[-1])[0]
    q_pos, q_neg, k_cat = _polarity_maps(q, k, power, alpha)
    q_cat = torch.cat([q_pos, q_neg], dim=-1)  # (B,h,N,2d)

    # One key-value summary for both streams: [k+, k-]^T v / n, (2d x d).
    kv = torch.matmul(k_cat.transpose(-2, -1), v) / n
    kv_top, kv_bottom = kv[..., :d, :], kv[..., d:, :]  # rows from k+ / k-
    # Same-signed stream: q+ k+^T v1 + q- k-^T v1  -> rows [top; bottom], cols v1.
    # Opposite stream:    q- k+^T v2 + q+ k-^T v2  -> rows [bottom; top], cols v2.
    numerator = torch.cat([
        torch.cat([kv_top[..., :d1], kv_bottom[..., d1:]], dim=-1),
        torch.cat([kv_bottom[..., :d1], kv_top[..., d1:]], dim=-1),
    ], dim=-2)  # (2d, d)
    k_mean = k_cat.mean(dim=-2, keepdim=True).transpose(-2, -1)  # (2d, 1)
    k_mean_swapped = torch.cat([k_mean[..., d:, :], k_mean[..., :d, :]], dim=-2)
    summary = torch.cat([numerator, k_mean, k_mean_swapped], dim=-1)  # (2d, d+2)

    out = torch.matmul(q_cat, summary)  # (B,h,N,d+2)
    z_sim = 1 / (out[..., d:d + 1] + eps)
    z_opp = 1 / (out[..., d + 1:d + 2] + eps)
    return torch.cat([out[..., :d1] * z_sim, out[..., d1:d] * z_opp], dim=-1)


def pola_linear_attention_reference(q: Tensor,
                                    k: Tensor,
                                    v: Tensor,
                                    power: Tensor,
                                    alpha: float = 4.0,
                                    eps: float = 1e-6) -> Tensor:
    """Explicit-weights version: forms both N x n attention maps. Tests only."""
    _check_inputs(q, k, v, power)
    n, d1 = k.shape[-2], _value_split(q.shape[-1])[0]
    q_pos, q_neg, keys = _polarity_maps(q, k, power, alpha)
    v1, v2 = v[..., :d1], v[..., d1:]

    outs = []
    for queries, values in ((torch.cat([q_pos, q_neg], -1), v1),
                            (torch.cat([q_neg, q_pos], -1), v2)):
        scores = torch.matmul(queries, keys.transpose(-2, -1))  # (B,h,N,n)
        weights = scores / (scores.sum(dim=-1, keepdim=True) + n * eps)
        outs.append(torch.matmul(weights, values))
    return torch.cat(outs, dim=-1)
