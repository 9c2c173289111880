"""Small building blocks shared by the Pola backbones."""
from functools import lru_cache
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmcv.cnn import build_activation_layer, build_norm_layer
from torch import Tensor

from ..ops.blocked_mlp import mlp_gelu
from ..utils.compat import in_graph_capture, is_autocast_enabled


def nlc_to_nchw(x: Tensor, hw_shape: Sequence[int]) -> Tensor:
    """Tokens (B, H*W, C) -> map (B, C, H, W)."""
    H, W = hw_shape
    B, N, C = x.shape
    if not in_graph_capture() and N != H * W:
        raise ValueError(f'token count {N} does not match the grid {H}x{W}')
    return x.transpose(1, 2).reshape(B, C, H, W)


def nchw_to_nlc(x: Tensor) -> Tensor:
    """Map (B, C, H, W) -> tokens (B, H*W, C)."""
    return x.flatten(2).transpose(1, 2)


def pad_to_multiple(x: Tensor, multiple: int) -> Tensor:
    """Zero-pad a (B, C, H, W) map on the bottom/right to multiples of ``multiple``
    (under a graph capture always, by amounts the graph computes from the sizes)."""
    H, W = x.shape[-2:]
    pad_h = (-H) % multiple
    pad_w = (-W) % multiple
    if in_graph_capture() or pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return x


def conv_token_map(conv: nn.Conv2d, x: Tensor) -> Tensor:
    """``conv(x)``; for a token map (tokens (B, H*W, C) viewed as (B, C, H, W): the
    channels-last layout) the convolution runs channels-last, with the weight laid
    out to match: with a plain weight the CPU convolution copies such an input to
    plain NCHW in the forward pass and again in the backward pass, and returns a
    plain output, whose tokens the next LayerNorm copies once more. The result is
    then channels-last, so that its tokens ``flatten(2).transpose(1, 2)`` are
    contiguous. The same values up to rounding."""
    if x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last):
        return conv(x)
    return conv._conv_forward(x, conv.weight.contiguous(memory_format=torch.channels_last),
                              conv.bias)


@lru_cache(maxsize=128)
def interpolation_matrix(src: int, dst: int, mode: str, device: torch.device,
                         dtype: torch.dtype) -> Tensor:
    """The (dst, src) matrix ``A`` with ``A @ x`` = ``F.interpolate`` of ``x`` along
    one axis from ``src`` to ``dst`` samples (``align_corners=False``): the weights
    of PyTorch's own kernel, read off by interpolating the identity (in float64)."""
    eye = torch.eye(src, dtype=torch.float64).view(src, 1, src, 1)
    weights = F.interpolate(eye, size=(dst, 1), mode=mode, align_corners=False)
    return weights.view(src, dst).t().to(device=device, dtype=dtype).contiguous()


def resize_token_grid(tokens: Tensor, src_hw: Sequence[int], dst_hw: Sequence[int],
                      mode: str) -> Tensor:
    """Resize (T, Hs*Ws, C) tokens laid out on ``src_hw`` to ``dst_hw``: the result
    of ``F.interpolate(..., mode, align_corners=False)`` ('bilinear' or 'bicubic';
    both are separable) up to rounding, as (T, Hd*Wd, C) contiguous tokens.

    Computed as two matrix products with the interpolation matrices of the two axes
    (cached per size), in the token layout: no channels-first copies, and a
    backward pass that is two matrix products too (the CPU backward of
    ``F.interpolate`` is a slow scatter). Returned as they are when the grids agree.
    Under a graph capture (FLOP counting, export, ``torch.compile``) it is
    ``F.interpolate`` itself, one recorded operator, at every call (also where the
    grids agree at capture time: a captured ``dst_hw`` stands for any size), and no
    matrix is cached.
    """
    src_hw, dst_hw = tuple(src_hw), tuple(dst_hw)
    T, N, C = tokens.shape
    (Hs, Ws), (Hd, Wd) = src_hw, dst_hw
    if in_graph_capture():
        grid = tokens.reshape(T, Hs, Ws, C).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=dst_hw, mode=mode, align_corners=False)
        return grid.flatten(2).transpose(1, 2)
    if src_hw == dst_hw:
        return tokens
    if N != Hs * Ws:
        raise ValueError(f'{N} tokens cannot be laid out on a {src_hw} grid')
    rows = interpolation_matrix(Hs, Hd, mode, tokens.device, tokens.dtype)
    cols = interpolation_matrix(Ws, Wd, mode, tokens.device, tokens.dtype)
    x = torch.matmul(rows, tokens.reshape(T, Hs, Ws * C))  # (T, Hd, Ws*C)
    x = torch.matmul(cols, x.reshape(T * Hd, Ws, C))  # (T*Hd, Wd, C)
    return x.reshape(T, Hd * Wd, C)


def run_blocks(blocks: Sequence[nn.Module],
               x: Tensor,
               hw_shape: Sequence[int],
               with_cp: bool = False,
               extra_args: Optional[Sequence[Optional[Tensor]]] = None) -> Tensor:
    """Run ``block(x, hw_shape[, extra])`` for every block in turn; with ``with_cp``
    (and gradients needed) each block is recomputed in the backward pass instead of
    keeping its activations (``torch.utils.checkpoint``, non-reentrant)."""
    if extra_args is None:
        extra_args = [None] * len(blocks)
    for block, extra in zip(blocks, extra_args):
        args = (x, hw_shape) if extra is None else (x, hw_shape, extra)
        if with_cp and x.requires_grad:
            x = cp.checkpoint(block, *args, use_reentrant=False)
        else:
            x = block(*args)
    return x


class PatchEmbed(nn.Module):
    """Conv patchify (kernel = stride = ``patch_size``) + norm.

    Inputs whose sides are not multiples of the patch are zero-padded on the
    bottom/right, so output sizes are ``ceil(H / patch_size)``.

    Args:
        in_channels (int): Channels of the input map.
        embed_dims (int): Output channels C.
        patch_size (int): Kernel and stride of the projection.
        norm_cfg (dict): Norm after the projection. Default: ``dict(type='LN')``.

    Input: (B, in_channels, H, W). Output: tokens (B, h*w, C) and (h, w).
    """

    def __init__(self,
                 in_channels: int,
                 embed_dims: int,
                 patch_size: int,
                 norm_cfg: dict = dict(type='LN')):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, kernel_size=patch_size, stride=patch_size)
        self.norm = build_norm_layer(norm_cfg, embed_dims)[1]

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """Patch tokens and their grid (see the class docstring)."""
        x = conv_token_map(self.proj, pad_to_multiple(x, self.patch_size))
        hw_shape = (x.shape[2], x.shape[3])
        return self.norm(nchw_to_nlc(x)), hw_shape


class Mlp(nn.Module):
    """fc1 - activation - dropout - fc2 - dropout (the official blocks' MLP).

    Args:
        embed_dims (int): Input and output channels.
        hidden_dims (int): Hidden channels.
        drop (float): Dropout after the activation and after fc2. Default: 0.
        act_cfg (dict): Activation. Default: ``dict(type='GELU')``.

    Input and output: (..., embed_dims).
    """

    def __init__(self,
                 embed_dims: int,
                 hidden_dims: int,
                 drop: float = 0.,
                 act_cfg: dict = dict(type='GELU')):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = build_activation_layer(act_cfg)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        """The MLP of every token: on the CPU with GELU and no active dropout, by
        :func:`~polaformer_mm.ops.mlp_gelu` (blocks of tokens; the same maths with a
        fraction of the memory traffic), else module by module."""
        if self._blocked(x):
            return mlp_gelu(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias,
                            self.act.approximate)
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))

    def _blocked(self, x: Tensor) -> bool:
        return (x.device.type == 'cpu' and x.dtype in (torch.float32, torch.float64)
                and type(self.act) is nn.GELU and not (self.training and self.drop.p > 0)
                and not is_autocast_enabled('cpu') and not in_graph_capture())


def drop_path_rates(drop_path_rate: float, depths: Sequence[int]) -> List[List[float]]:
    """Linearly increasing stochastic-depth rates, split per stage."""
    rates = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
    out, start = [], 0
    for depth in depths:
        out.append(rates[start:start + depth])
        start += depth
    return out
