"""Small building blocks shared by the Pola backbones."""
from typing import Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


def nlc_to_nchw(x: Tensor, hw_shape: Sequence[int]) -> Tensor:
    H, W = hw_shape
    B, N, C = x.shape
    if N != H * W:
        raise ValueError(f'token count {N} does not match the grid {H}x{W}')
    return x.transpose(1, 2).reshape(B, C, H, W)


def nchw_to_nlc(x: Tensor) -> Tensor:
    return x.flatten(2).transpose(1, 2)


def pad_to_multiple(x: Tensor, multiple: int) -> Tensor:
    """Zero-pad a (B, C, H, W) map on the bottom/right to multiples of ``multiple``."""
    H, W = x.shape[-2:]
    pad_h = (-H) % multiple
    pad_w = (-W) % multiple
    if pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return x


def resize_token_grid(tokens: Tensor, src_hw: Sequence[int],
                      dst_hw: Sequence[int], mode: str) -> Tensor:
    """Resize (1, Hs*Ws, C) tokens laid out on ``src_hw`` to ``dst_hw``."""
    src_hw, dst_hw = tuple(src_hw), tuple(dst_hw)
    if src_hw == dst_hw:
        return tokens
    _, N, C = tokens.shape
    if N != src_hw[0] * src_hw[1]:
        raise ValueError(f'{N} tokens cannot be laid out on a {src_hw} grid')
    grid = tokens.reshape(1, src_hw[0], src_hw[1], C).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=dst_hw, mode=mode, align_corners=False)
    return grid.flatten(2).transpose(1, 2)


class PatchEmbed(nn.Module):
    """Conv patchify (kernel = stride = patch) + LayerNorm.

    Inputs whose sides are not multiples of the patch are zero-padded on the
    bottom/right, so output sizes are ``ceil(H / patch)``.
    """

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(
            in_channels, embed_dims, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dims)

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        x = self.proj(pad_to_multiple(x, self.patch_size))
        hw_shape = (x.shape[2], x.shape[3])
        return self.norm(nchw_to_nlc(x)), hw_shape


class Mlp(nn.Module):
    """fc1 - GELU - fc2 (dropout after each, as in the official blocks)."""

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


def drop_path_rates(drop_path_rate: float, depths: Sequence[int]):
    """Linearly increasing stochastic-depth rates, split per stage."""
    rates = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
    out, start = [], 0
    for depth in depths:
        out.append(rates[start:start + depth])
        start += depth
    return out
