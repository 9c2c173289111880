"""The transformer MLP ``fc2(gelu(fc1(x)))`` run over blocks of tokens on the CPU.

At detection sizes the hidden activations of an MLP are the largest tensors of a backbone
(Pola-PVT-T's first stage at 800x1333: 66,800 tokens x 512 channels;
docs/advanced_guides/performance.md), and autograd keeps two of them per block (the input
of GELU and that of fc2) and makes two more in the backward pass, each written to and read
back from main memory by one operator after another. :func:`mlp_gelu` computes the same
maths over blocks of about ``BLOCK_ELEMENTS`` hidden values, so that every block's GELU,
second product and gradients work on data still in the CPU's caches, and keeps only the
input and the pre-activation ``fc1(x)`` for the backward pass (GELU is recomputed from it
there, one element-wise pass). Values and gradients are those of ``nn.Linear`` /
``nn.GELU`` / ``nn.Linear`` up to rounding (the weight gradients are sums over blocks).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['mlp_gelu', 'BLOCK_ELEMENTS']

#: Hidden values (rows x hidden channels) per block (also those of the exported graphs'
#: blocks: :mod:`polaformer_mm.deployment.blocked_mlp`).
BLOCK_ELEMENTS = 1 << 21


def _row_blocks(rows: int, hidden: int):
    step = max(1, BLOCK_ELEMENTS // hidden)
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


def _forward(x: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor],
             approximate: str, keep_hidden: bool):
    """(output (M, C_out), the pre-activation of every block (a list) or None) for
    x (M, C)."""
    M, hidden = x.shape[0], w1.shape[0]
    out = x.new_empty(M, w2.shape[0])
    pre = [] if keep_hidden else None
    w1t, w2t = w1.t(), w2.t()
    for rows in _row_blocks(M, hidden):
        h = _linear(x[rows], w1t, b1)
        _linear(F.gelu(h, approximate=approximate), w2t, b2, out[rows])
        if pre is not None:
            pre.append(h)
    return out, pre


def _linear(x: Tensor,
            weight_t: Tensor,
            bias: Optional[Tensor],
            out: Optional[Tensor] = None) -> Tensor:
    """``x @ weight_t + bias`` as ``F.linear`` computes it (addmm), into ``out``."""
    if bias is None:
        return torch.mm(x, weight_t, out=out)
    return torch.addmm(bias, x, weight_t, out=out)


class _BlockedMlp(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor],
                approximate: str) -> Tensor:
        out, pre = _forward(
            x.reshape(-1, x.shape[-1]), w1, b1, w2, b2, approximate, keep_hidden=True)
        ctx.approximate = approximate
        ctx.input_shape = x.shape
        ctx.has_bias = (b1 is not None, b2 is not None)
        # the pre-activation as one tensor per block: blocks of a few MB are recycled
        # by the C allocator from one step to the next, where one tensor of hundreds
        # of MB is mapped afresh (and its pages faulted in) at every step
        ctx.save_for_backward(x, w1, w2, *pre)
        return out.view(*x.shape[:-1], w2.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        x, w1, w2, *pre = ctx.saved_tensors
        x = x.reshape(-1, x.shape[-1])
        M, hidden = x.shape[0], w1.shape[0]
        grad = grad.reshape(M, -1)
        g_x = x.new_empty(x.shape)
        g_w1, g_w2 = torch.zeros_like(w1), torch.zeros_like(w2)
        g_b1 = w1.new_zeros(hidden) if ctx.has_bias[0] else None
        for rows, h in zip(_row_blocks(M, hidden), pre):
            g = grad[rows]
            g_w2.addmm_(g.t(), F.gelu(h, approximate=ctx.approximate))
            g_h = torch.ops.aten.gelu_backward(torch.mm(g, w2), h, approximate=ctx.approximate)
            g_w1.addmm_(g_h.t(), x[rows])
            if g_b1 is not None:
                g_b1 += g_h.sum(dim=0)
            torch.mm(g_h, w1, out=g_x[rows])
        g_b2 = grad.sum(dim=0) if ctx.has_bias[1] else None
        return g_x.view(ctx.input_shape), g_w1, g_b1, g_w2, g_b2, None


def mlp_gelu(x: Tensor,
             fc1_weight: Tensor,
             fc1_bias: Optional[Tensor],
             fc2_weight: Tensor,
             fc2_bias: Optional[Tensor],
             approximate: str = 'none') -> Tensor:
    """``F.linear(F.gelu(F.linear(x, fc1_weight, fc1_bias), approximate), fc2_weight,
    fc2_bias)`` over blocks of tokens (see the module docstring).

    Args:
        x (Tensor): (..., C), float32 or float64, on the CPU.
        fc1_weight (Tensor): (hidden, C). fc1_bias (Tensor, optional): (hidden,).
        fc2_weight (Tensor): (C_out, hidden). fc2_bias (Tensor, optional): (C_out,).
        approximate (str): GELU's ``approximate``, 'none' or 'tanh'. Default: 'none'.

    Returns:
        Tensor: (..., C_out).
    """
    if x.shape[-1] != fc1_weight.shape[1] or fc2_weight.shape[1] != fc1_weight.shape[0]:
        raise ValueError(f'mlp_gelu: x {tuple(x.shape)}, fc1 weight '
                         f'{tuple(fc1_weight.shape)} and fc2 weight {tuple(fc2_weight.shape)} '
                         'do not chain')
    tensors = (x, fc1_weight, fc1_bias, fc2_weight, fc2_bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return _BlockedMlp.apply(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, approximate)
    out, _ = _forward(
        x.reshape(-1, x.shape[-1]),
        fc1_weight,
        fc1_bias,
        fc2_weight,
        fc2_bias,
        approximate,
        keep_hidden=False)
    return out.view(*x.shape[:-1], fc2_weight.shape[0])
