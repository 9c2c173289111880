"""The key summary ``W`` (2d x (d + 2)) of both streams, and its gradient split back.

Rows 0..d-1 multiply q+ and rows d..2d-1 multiply q-; columns: the numerators of the
same-signed stream (v1 channels), of the opposite stream (v2 channels), then the
denominators of both streams. Used by the blocked autograd Function (:mod:`.function`) and
the Triton backend (:mod:`.triton_backend`).
"""
from typing import Tuple

from torch import Tensor

from .formulation import value_split

__all__ = ['assemble_summary', 'summary_grads']


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


def summary_grads(g_W: Tensor, d: int) -> Tuple[Tensor, Tensor]:
    """Gradients of [k+, k-]^T v / n (2d, d) and of the key means (2d,) from that of W
    (:func:`assemble_summary`)."""
    d1 = value_split(d)
    g_kv = g_W.new_empty(g_W.shape[:-1] + (d, ))
    g_kv[..., :d1] = g_W[..., :d1]
    g_kv[..., d:, d1:] = g_W[..., :d, d1:d]
    g_kv[..., :d, d1:] = g_W[..., d:, d1:d]
    g_mean = g_W[..., d].clone()
    g_mean[..., :d] += g_W[..., d:, d + 1]
    g_mean[..., d:] += g_W[..., :d, d + 1]
    return g_kv, g_mean
