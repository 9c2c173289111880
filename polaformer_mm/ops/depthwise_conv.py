"""Depthwise 2-D convolution (stride 1, 'same' zero padding) with a fast CPU backward.

The local term of Pola attention is a depthwise k x k convolution of the values. On the
CPU, torch's own backward of a depthwise convolution computes the weight gradient with a
generic kernel that is many times slower than the forward at detection sizes
(docs/advanced_guides/performance.md). :func:`depthwise_conv2d` computes the same gradients
with two ordinary convolutions instead:

* input gradient: the convolution of the output gradient with the flipped kernel (stride
  1 and symmetric padding make the transposed convolution an ordinary one), run in the
  channels-last layout that oneDNN's depthwise kernels prefer;
* weight gradient: for channel c, ``gw[c, i, j] = sum_{b,y,x} x_pad[b, c, y+i, x+j] *
  g[b, c, y, x]``, which is a grouped convolution of the padded input with the output
  gradient as a (H x W) kernel, one group per (batch, channel), summed over the batch.

Elsewhere (CUDA, when no gradient is needed, under autocast) it is ``F.conv2d``. It is an
eager fast path, as :func:`~polaformer_mm.ops.mlp_gelu` is: a caller that may be recorded
into a graph calls ``F.conv2d`` there instead (the model's layers do so,
:func:`polaformer_mm.models.utils.depthwise_conv`).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..utils.compat import is_autocast_enabled

__all__ = ['depthwise_conv2d']


class _DepthwiseConv2d(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        pad = weight.shape[-1] // 2
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.conv2d(x, weight, bias, padding=pad, groups=x.shape[1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        B, C, H, W = x.shape
        k = weight.shape[-1]
        pad = k // 2
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = F.conv2d(
                grad.contiguous(memory_format=torch.channels_last),
                weight.flip(-2, -1),
                padding=pad,
                groups=C)
        if ctx.needs_input_grad[1]:
            # both in plain NCHW, which this convolution wants: x (channels-last in the
            # Pola blocks) goes straight into the middle of a zero frame, one copy
            x_pad = x.new_zeros(1, B * C, H + 2 * pad, W + 2 * pad)
            x_pad[0, :, pad:pad + H, pad:pad + W].view(B, C, H, W).copy_(x)
            grad_w = F.conv2d(x_pad, grad.contiguous().view(B * C, 1, H, W), groups=B * C)
            grad_w = grad_w.reshape(B, C, 1, k, k).sum(0)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum((0, 2, 3))
        return grad_x, grad_w, grad_b


def depthwise_conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """Depthwise convolution of ``x`` (B, C, H, W) with ``weight`` (C, 1, k, k), odd k,
    stride 1 and zero padding k // 2 (output (B, C, H, W)); ``bias`` (C,) optional.

    The same result as ``F.conv2d(x, weight, bias, padding=k // 2, groups=C)``; on the
    CPU with gradients its backward pass uses the faster formulation of the module
    docstring.
    """
    C, k = x.shape[1], weight.shape[-1]
    if weight.shape != (C, 1, k, k) or k % 2 == 0:
        raise ValueError(f'depthwise_conv2d expects a ({C}, 1, k, k) weight with odd k '
                         f'for {C} channels; got {tuple(weight.shape)}')
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                              (bias is not None and bias.requires_grad))
    if x.device.type == 'cpu' and needs_grad and not is_autocast_enabled('cpu'):
        return _DepthwiseConv2d.apply(x, weight, bias)
    return F.conv2d(x, weight, bias, padding=k // 2, groups=C)
