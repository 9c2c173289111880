"""Adaptive average pooling exact at every input size of a graph (mmdeploy lays its own
rewrite out in ``mmdeploy/pytorch/functions/adaptive_pool.py``)."""
import torch
from torch import Tensor

__all__ = ['adaptive_avg_pool2d_matmul', 'adaptive_avg_pool2d__onnxruntime']


def _pool_matrix(size, out: int, like: Tensor) -> Tensor:
    """(out, size): row i averages the inputs [floor(i size / out), ceil((i + 1) size /
    out)), the bins of adaptive average pooling, from a size the graph computes."""
    rows = torch.arange(out, device=like.device)[:, None]
    cols = torch.arange(size, device=like.device)[None, :]
    start = rows * size // out  # non-negative: ONNX Div truncation is floor here
    end = ((rows + 1) * size + out - 1) // out
    inside = (cols >= start) & (cols < end)
    return inside.to(like.dtype) / (end - start).to(like.dtype)


def adaptive_avg_pool2d_matmul(x: Tensor, output_size) -> Tensor:
    """``F.adaptive_avg_pool2d(x, output_size)`` as two matrix products with the bin
    matrices of the input's size, so that a graph of it pools correctly at every input
    size (mmdeploy replaces adaptive pooling by an ``avg_pool2d`` whose kernel is fixed
    at the export size, which pools other bins already there unless the sizes divide,
    e.g. UperNet's pooling scales 3 and 6 of a 4x4 map)."""
    out_h, out_w = (output_size, output_size) if isinstance(output_size, int) else output_size
    H, W = x.shape[-2:]
    out_h = H if out_h is None else int(out_h)
    out_w = W if out_w is None else int(out_w)
    return _pool_matrix(H, out_h, x) @ x @ _pool_matrix(W, out_w, x).transpose(0, 1)


def adaptive_avg_pool2d__onnxruntime(input, output_size):
    """Adaptive average pooling, exact at every input size of the graph: the rewrite of
    ``F.adaptive_avg_pool2d`` for onnxruntime (:func:`adaptive_avg_pool2d_matmul`; global
    pooling keeps torch's own)."""
    from mmdeploy.core import FUNCTION_REWRITER
    if output_size in (1, (1, 1), [1, 1]):
        return FUNCTION_REWRITER.get_context().origin_func(input, output_size)
    return adaptive_avg_pool2d_matmul(input, output_size)
