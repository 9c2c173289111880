"""Attention modules: polarity-aware linear attention and the softmax baselines
used by 'S' stages (PVT spatial-reduction attention, Swin window attention)."""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS
from torch import Tensor

from ..ops import pola_linear_attention
from .utils import nchw_to_nlc, nlc_to_nchw, pad_to_multiple, resize_token_grid


def _head_dims(embed_dims: int, num_heads: int) -> int:
    if embed_dims % num_heads:
        raise ValueError(f'embed_dims {embed_dims} is not divisible by '
                         f'num_heads {num_heads}')
    return embed_dims // num_heads


class _SpatialReduction(nn.Module):
    """Conv(kernel = stride = r) + LayerNorm producing the reduced key/value tokens.

    Maps whose sides are not multiples of r are zero-padded (ceil), so the key grid
    is never empty.
    """

    def __init__(self, embed_dims: int, ratio: int):
        super().__init__()
        self.ratio = ratio
        self.sr = nn.Conv2d(embed_dims, embed_dims, kernel_size=ratio, stride=ratio)
        self.norm = nn.LayerNorm(embed_dims)

    def forward(self, x: Tensor, hw_shape) -> Tuple[Tensor, Tuple[int, int]]:
        x = self.sr(pad_to_multiple(nlc_to_nchw(x, hw_shape), self.ratio))
        kv_hw = (x.shape[2], x.shape[3])
        return self.norm(nchw_to_nlc(x)), kv_hw


@MODELS.register_module()
class PolaLinearAttention(nn.Module):
    """Polarity-aware linear attention (PolaFormer, DESIGN.md section 1) on any grid.

    Args:
        embed_dims (int): channels C.
        num_heads (int): heads h; the head width is C / h.
        pos_grid (Sequence[int]): (H0, W0), the key grid the positional encoding P
            was learned on (the grid at pretraining, after spatial reduction). At run
            time P is resized (bicubic) to the actual key grid when they differ.
        sr_ratio (int): spatial-reduction ratio r for keys/values (PVT layout only).
        kernel_size (int): kernel of the depthwise conv on v (shared by all heads).
        alpha (float): the exponent is ``1 + alpha * sigmoid(power)``.
        qkv_bias (bool): bias of the q/k/v/g projections.
        layout (str): 'pvt' (``qg`` and ``kv`` projections) or 'swin' (one ``qkvg``).
        proj_drop (float): dropout after the output projection.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 pos_grid: Sequence[int],
                 sr_ratio: int = 1,
                 kernel_size: int = 5,
                 alpha: float = 4.0,
                 qkv_bias: bool = True,
                 layout: str = 'pvt',
                 proj_drop: float = 0.):
        super().__init__()
        if layout not in ('pvt', 'swin'):
            raise ValueError(f"layout must be 'pvt' or 'swin', got {layout!r}")
        if layout == 'swin' and sr_ratio != 1:
            raise ValueError('the swin layout has no spatial reduction '
                             f'(sr_ratio must be 1, got {sr_ratio})')
        if sr_ratio < 1 or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f'sr_ratio must be >= 1 and kernel_size odd; got '
                             f'sr_ratio={sr_ratio}, kernel_size={kernel_size}')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = _head_dims(embed_dims, num_heads)
        self.pos_grid = tuple(int(s) for s in pos_grid)
        self.sr_ratio = sr_ratio
        self.alpha = float(alpha)
        self.layout = layout

        if layout == 'swin':
            self.qkvg = nn.Linear(embed_dims, 4 * embed_dims, bias=qkv_bias)
        else:
            self.qg = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
            self.kv = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
            self.reduction = (
                _SpatialReduction(embed_dims, sr_ratio) if sr_ratio > 1 else None)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)
        self.dwc = nn.Conv2d(
            self.head_dims,
            self.head_dims,
            kernel_size=kernel_size,
            padding=kernel_size // 2,
            groups=self.head_dims)
        self.power = nn.Parameter(torch.zeros(1, num_heads, 1, self.head_dims))
        self.scale = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.positional_encoding = nn.Parameter(
            torch.zeros(1, self.pos_grid[0] * self.pos_grid[1], embed_dims))

    def extra_repr(self) -> str:
        return (f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, '
                f'layout={self.layout!r}, sr_ratio={self.sr_ratio}, '
                f'alpha={self.alpha}, pos_grid={self.pos_grid}')

    def _split_heads(self, x: Tensor) -> Tensor:
        B, N, _ = x.shape
        return x.reshape(B, N, self.num_heads, self.head_dims).transpose(1, 2)

    def forward(self,
                x: Tensor,
                hw_shape: Sequence[int],
                padding_mask: Optional[Tensor] = None) -> Tensor:
        """Attend over the tokens ``x`` (B, H*W, C) laid out on ``hw_shape`` (H, W).

        ``padding_mask`` (B, H*W) bool, optional: True where a token was added by
        padding (windowed Swin stages pad maps to a multiple of the window). Such
        tokens take no part as keys or values: their keys and values are set to zero
        (zero keys have zero polarity features, so they add nothing to ``K^T V`` or
        the key means; zero values add nothing to the depthwise conv, as the conv's
        own zero padding at a window border), and the normaliser is that of the real
        keys alone. Their outputs are meaningless and must be dropped by the caller.
        """
        B, N, C = x.shape
        H, W = hw_shape
        if N != H * W or C != self.embed_dims:
            raise ValueError(
                f'PolaLinearAttention expects (B, {H}*{W}, {self.embed_dims}) '
                f'tokens for hw_shape {tuple(hw_shape)}; got {tuple(x.shape)}')
        if padding_mask is not None and self.layout != 'swin':
            raise ValueError('padding_mask is only supported by the swin layout '
                             '(keys and queries on the same grid)')
        kv_hw = (H, W)
        if self.layout == 'swin':
            q, k, v, g = self.qkvg(x).reshape(B, N, 4, C).unbind(2)
        else:
            q, g = self.qg(x).reshape(B, N, 2, C).unbind(2)
            if self.reduction is not None:
                x, kv_hw = self.reduction(x, hw_shape)
            k, v = self.kv(x).reshape(B, -1, 2, C).unbind(2)
        n = k.shape[1]

        k = k + resize_token_grid(self.positional_encoding, self.pos_grid,
                                  kv_hw, mode='bicubic')
        eps = 1e-6
        if padding_mask is not None:
            if padding_mask.shape != (B, N):
                raise ValueError(f'padding_mask must be ({B}, {N}), got '
                                 f'{tuple(padding_mask.shape)}')
            keep = (~padding_mask).unsqueeze(-1).to(k.dtype)
            k, v = k * keep, v * keep
            # eps of the real keys alone: the op's normaliser is q.sum(K)/n + eps
            eps = keep.sum(dim=1).view(B, 1, 1, 1) * (eps / N)
        scale = F.softplus(self.scale)
        q = self._split_heads(q / scale)
        k = self._split_heads(k / scale)
        v = self._split_heads(v)

        out = pola_linear_attention(q, k, v, self.power, self.alpha, eps)
        out = out.transpose(1, 2).reshape(B, N, C)

        # Local term: one depthwise conv shared by all heads, on v laid out per head.
        h, d = self.num_heads, self.head_dims
        if n != N:
            # the official code stretches the flattened key sequence (1-D linear).
            v = F.interpolate(
                v.transpose(-2, -1).reshape(B * h, d, n), size=N, mode='linear')
            v = v.reshape(B, h, d, N).transpose(-2, -1)
        v = v.reshape(B * h, H, W, d).permute(0, 3, 1, 2)
        v = self.dwc(v).reshape(B, C, N).transpose(1, 2)

        out = self.proj((out + v) * g)
        return self.proj_drop(out)


class SpatialReductionAttention(nn.Module):
    """PVT v1 softmax attention with spatially reduced keys/values ('S' stages)."""

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sr_ratio: int = 1,
                 qkv_bias: bool = True,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.):
        super().__init__()
        self.num_heads = num_heads
        self.head_dims = _head_dims(embed_dims, num_heads)
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
        self.reduction = (
            _SpatialReduction(embed_dims, sr_ratio) if sr_ratio > 1 else None)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, hw_shape: Sequence[int]) -> Tensor:
        B, N, C = x.shape
        q = self.q(x).reshape(B, N, self.num_heads, self.head_dims).transpose(1, 2)
        if self.reduction is not None:
            x, _ = self.reduction(x, hw_shape)
        k, v = self.kv(x).reshape(B, -1, 2, self.num_heads,
                                  self.head_dims).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0.)
        out = out.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(out))


def relative_position_index(window_size: int) -> Tensor:
    """Index into the (2w-1)^2 bias table for every (query, key) pair of a window."""
    coords = torch.stack(
        torch.meshgrid(
            torch.arange(window_size), torch.arange(window_size),
            indexing='ij')).flatten(1)  # (2, w*w): row, col
    rel = coords[:, :, None] - coords[:, None, :] + window_size - 1
    return rel[0] * (2 * window_size - 1) + rel[1]


class WindowMSA(nn.Module):
    """Swin window self-attention with a relative position bias ('S' stages)."""

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 window_size: int,
                 qkv_bias: bool = True,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.):
        super().__init__()
        self.num_heads = num_heads
        self.head_dims = _head_dims(embed_dims, num_heads)
        self.window_size = window_size
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size - 1)**2, num_heads))
        self.register_buffer(
            'relative_position_index',
            relative_position_index(window_size),
            persistent=False)
        self.qkv = nn.Linear(embed_dims, 3 * embed_dims, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """x: (B*nW, T, C) windows; mask: (nW, T, T) additive, or None."""
        Bw, T, C = x.shape
        qkv = self.qkv(x).reshape(Bw, T, 3, self.num_heads,
                                  self.head_dims).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.head_dims**-0.5) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[
            self.relative_position_index.view(-1)].view(T, T, -1)
        attn = attn + bias.permute(2, 0, 1).unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(Bw // nW, nW, self.num_heads, T, T) + mask[:, None]
            attn = attn.view(Bw, self.num_heads, T, T)
        attn = self.attn_drop(attn.softmax(dim=-1))
        out = (attn @ v).transpose(1, 2).reshape(Bw, T, C)
        return self.proj_drop(self.proj(out))
