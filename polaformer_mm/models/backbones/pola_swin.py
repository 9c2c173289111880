"""Pola-Swin: Swin v1 with polarity-aware linear attention stages, at any input size."""
import re
from functools import lru_cache
from typing import Dict, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath
from mmengine.registry import MODELS
from mmengine.utils import to_2tuple

from ..attention import PolaLinearAttention, WindowMSA
from ..utils import Mlp, PatchEmbed, drop_path_rates
from .base import PolaBackboneBase


def window_partition(x: torch.Tensor, window_size: int) -> torch.Tensor:
    """(B, Hp, Wp, ...) -> (B * nW, window_size**2, ...), windows in row-major order."""
    B, Hp, Wp = x.shape[:3]
    rest = x.shape[3:]
    x = x.view(B, Hp // window_size, window_size, Wp // window_size, window_size,
               *rest)
    x = x.transpose(2, 3)
    return x.reshape(-1, window_size * window_size, *rest)


def window_reverse(windows: torch.Tensor, window_size: int, Hp: int,
                   Wp: int) -> torch.Tensor:
    C = windows.shape[-1]
    x = windows.view(-1, Hp // window_size, Wp // window_size, window_size,
                     window_size, C)
    return x.transpose(2, 3).reshape(-1, Hp, Wp, C)


def _padded_size(size: int, window_size: int) -> int:
    return -(-size // window_size) * window_size


def _window_shift(hw_shape: Sequence[int], window_size: int, shifted: bool) -> int:
    """Half a window on shifted blocks, when the map is larger than one window along
    both sides; 0 otherwise (a map no larger than the window along its shorter side
    is one window row, never shifted: the official rule)."""
    return window_size // 2 if shifted and min(hw_shape) > window_size else 0


@lru_cache(maxsize=64)
def _window_regions(H: int, W: int, window_size: int, shift: int):
    """Per window token ids (nW, T) over an H x W map padded to multiples of the
    window and rolled by -shift: the shift region (0..8) of every real token, -1 for
    tokens added by padding. None when there is neither shift nor padding."""
    Hp, Wp = _padded_size(H, window_size), _padded_size(W, window_size)
    if shift == 0 and (Hp, Wp) == (H, W):
        return None

    def regions(size, valid):
        ids = torch.zeros(size, dtype=torch.long)
        if shift:
            ids[size - window_size:size - shift] = 1
            ids[size - shift:] = 2
        # padding sits at the end before the roll; follow it into rolled coordinates
        pad = torch.roll(torch.arange(size) >= valid, -shift)
        return ids, pad

    ids_h, pad_h = regions(Hp, H)
    ids_w, pad_w = regions(Wp, W)
    ids = ids_h[:, None] * 3 + ids_w[None, :]
    ids[pad_h[:, None] | pad_w[None, :]] = -1
    return window_partition(ids[None], window_size)  # (nW, T)


@lru_cache(maxsize=64)
def _window_mask(H: int, W: int, window_size: int, shift: int,
                 device: torch.device):
    """Additive (nW, T, T) mask of the softmax windows: -100 between tokens of
    different shift regions, and between real and padded tokens. None when nothing
    is masked."""
    ids = _window_regions(H, W, window_size, shift)
    if ids is None:
        return None
    mask = (ids[:, :, None] != ids[:, None, :]).float() * -100.0
    return mask.to(device)


@lru_cache(maxsize=64)
def _window_padding(H: int, W: int, window_size: int, shift: int,
                    device: torch.device):
    """(nW, T) bool, True at tokens added by padding; None without padding. The
    linear windows ignore the shift regions, as the official code does."""
    if (_padded_size(H, window_size), _padded_size(W, window_size)) == (H, W):
        return None
    return (_window_regions(H, W, window_size, shift) < 0).to(device)


class SwinBlock(nn.Module):
    """Swin block: ``x + attn(norm1(x))``, ``x + mlp(norm2(x))``.

    'L' blocks run Pola linear attention, either in windows of
    ``linear_window_size`` (the official form: the map is zero-padded to a multiple
    of the window, odd blocks are shifted by half a window when the map is larger
    than the window, the shift mask is not applied, padded tokens take no part) or,
    with ``linear_window_size=None``, over the whole map at once (one window, never
    shifted, the positional encoding resized to the map). 'S' blocks run shifted
    window softmax attention with ``window_size``.
    """

    def __init__(self, embed_dims, num_heads, attn_type, window_size, shift,
                 pos_grid, alpha, kernel_size, mlp_ratio, qkv_bias, drop,
                 attn_drop, drop_path, linear_window_size=None):
        super().__init__()
        self.uses_pola = attn_type == 'L'
        self.shifted = bool(shift)
        if self.uses_pola:
            # None: one global window; an int: windows whose grid is also P's
            self.window_size = linear_window_size
        else:
            self.window_size = window_size
        self.norm1 = nn.LayerNorm(embed_dims)
        if self.uses_pola:
            self.attn = PolaLinearAttention(
                embed_dims,
                num_heads,
                pos_grid=pos_grid,
                kernel_size=kernel_size,
                alpha=alpha,
                qkv_bias=qkv_bias,
                layout='swin',
                proj_drop=drop)
        else:
            self.attn = WindowMSA(
                embed_dims,
                num_heads,
                window_size,
                qkv_bias=qkv_bias,
                attn_drop=attn_drop,
                proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(embed_dims)
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop=drop)

    def _window_attention(self, x, hw_shape):
        H, W = hw_shape
        B, N, C = x.shape
        ws = self.window_size
        shift = _window_shift(hw_shape, ws, self.shifted)
        Hp, Wp = _padded_size(H, ws), _padded_size(W, ws)
        x = x.view(B, H, W, C)
        if (Hp, Wp) != (H, W):
            x = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H))
        if shift:
            x = torch.roll(x, (-shift, -shift), dims=(1, 2))
        windows = window_partition(x, ws)
        if self.uses_pola:
            padding = _window_padding(H, W, ws, shift, x.device)
            if padding is not None:
                padding = padding.repeat(B, 1)
            windows = self.attn(windows, (ws, ws), padding_mask=padding)
        else:
            mask = _window_mask(H, W, ws, shift, x.device)
            if mask is not None:
                mask = mask.to(x.dtype)
            windows = self.attn(windows, mask)
        x = window_reverse(windows, ws, Hp, Wp)
        if shift:
            x = torch.roll(x, (shift, shift), dims=(1, 2))
        return x[:, :H, :W].reshape(B, N, C)

    def forward(self, x, hw_shape):
        y = self.norm1(x)
        if self.uses_pola and self.window_size is None:
            y = self.attn(y, hw_shape)
        else:
            y = self._window_attention(y, hw_shape)
        x = x + self.drop_path(y)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    """2x2 neighbourhood concat ([0::2,0::2], [1::2,0::2], [0::2,1::2], [1::2,1::2]),
    LayerNorm(4C), Linear(4C, 2C, no bias). Odd sides are zero-padded."""

    def __init__(self, in_dims: int, out_dims: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * in_dims)
        self.reduction = nn.Linear(4 * in_dims, out_dims, bias=False)

    def forward(self, x, hw_shape):
        H, W = hw_shape
        B, N, C = x.shape
        x = x.view(B, H, W, C)
        if H % 2 or W % 2:
            x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        x = torch.cat([
            x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]
        ], dim=-1)
        hw_shape = (x.shape[1], x.shape[2])
        x = x.reshape(B, -1, 4 * C)
        return self.reduction(self.norm(x)), hw_shape


class SwinStage(nn.Module):

    def __init__(self, blocks, downsample=None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


@MODELS.register_module()
class PolaSwin(PolaBackboneBase):
    """Pola-Swin backbone (Swin v1 with Pola linear-attention stages).

    Args:
        arch (str | dict): 'tiny', 'small', 'base', or a dict with
            ``embed_dims`` (int, first stage), ``depths`` and ``num_heads``.
        attn_types (str): per stage, 'L' (Pola linear attention) or 'S' (shifted
            window softmax attention with ``window_size``).
        window_size (int): window of the 'S' stages (7; 12 for the official 384
            Swin-B, whose ``linear_window_size`` is 96).
        linear_window_size (int | None): window of the 'L' stages. An int gives
            each 'L' stage a square window of ``min(linear_window_size, the
            stage's grid at pretrain_img_size)`` (56 and 28 for the 224 models,
            96 and 48 for the 384 Swin-B), which is also the grid of its learned
            positional encoding ``P``, used as learned at any input size: the
            official computation. At run time the map is zero-padded to a multiple
            of the window and partitioned; odd blocks are shifted by half a window
            when the map is larger than the window along both sides (without a
            shift mask, as in the official code). Where the official code has no
            counterpart (maps that are not multiples of the window), padded tokens
            take no part as keys or values and their outputs are dropped; the
            depthwise conv runs per window, as in the official code. None: one
            window over the whole map, never shifted, ``P`` learned on the stage's
            grid at ``pretrain_img_size`` and resized (bicubic) to the runtime map.
            At 224 both forms are the official computation. Defaults to 56.
        pretrain_img_size (int | tuple): input size at pretraining; sets the stage
            grids (56x56, 28x28, ... at 224) the windows and the positional
            encodings of the 'L' stages derive from.
        out_indices (Sequence[int]): stages returned, each after its LayerNorm
            ``norm{i}`` (``norm3`` is the official final norm).
        frozen_stages (int): -1 freezes nothing, 0 the patch embedding, k >= 1
            also stages 0..k-1 (with their downsampling and output norms).
        norm_eval (bool), with_cp (bool): as for PolaPVT.
        pretrained (str, optional): deprecated, as in mmseg; the same as
            ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)``.
    """

    kind = 'swin'
    arch_zoo: Dict[str, dict] = {
        **dict.fromkeys(['t', 'tiny'],
                        dict(embed_dims=96, depths=[2, 2, 6, 2],
                             num_heads=[3, 6, 12, 24])),
        **dict.fromkeys(['s', 'small'],
                        dict(embed_dims=96, depths=[2, 2, 18, 2],
                             num_heads=[3, 6, 12, 24])),
        **dict.fromkeys(['b', 'base'],
                        dict(embed_dims=128, depths=[2, 2, 18, 2],
                             num_heads=[4, 8, 16, 32])),
    }
    _arch_keys = ('embed_dims', 'depths', 'num_heads')

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 attn_types: str = 'LLSS',
                 window_size: int = 7,
                 linear_window_size: Optional[int] = 56,
                 pretrain_img_size: Union[int, Sequence[int]] = 224,
                 patch_size: int = 4,
                 in_channels: int = 3,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 alpha: float = 4.0,
                 kernel_size: int = 5,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 pretrained: Optional[str] = None,
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg, pretrained=pretrained)
        arch = self._parse_arch(arch)
        depths, num_heads = arch['depths'], arch['num_heads']
        num_stages = len(depths)
        self._setup_stages(num_stages, attn_types, out_indices, frozen_stages,
                           norm_eval, with_cp)
        attn_types = self.attn_types
        pretrain_img_size = to_2tuple(pretrain_img_size)
        self.arch = arch

        self.patch_embed = PatchEmbed(in_channels, arch['embed_dims'], patch_size)
        self.drop_after_pos = nn.Dropout(drop_rate)
        dpr = drop_path_rates(drop_path_rate, depths)
        grid = [s // patch_size for s in pretrain_img_size]
        if linear_window_size is not None:
            linear_window_size = int(linear_window_size)
            if linear_window_size < 1:
                raise ValueError('linear_window_size must be a positive int or '
                                 f'None, got {linear_window_size}')
        self.linear_window_size = linear_window_size
        dims = arch['embed_dims']
        self.num_features = []
        self.stages = nn.ModuleList()
        for i in range(num_stages):
            if linear_window_size is None:
                stage_window, pos_grid = None, grid
            else:
                stage_window = min(linear_window_size, *grid)
                pos_grid = [stage_window, stage_window]
            blocks = [
                SwinBlock(
                    dims,
                    num_heads[i],
                    attn_type=attn_types[i],
                    window_size=window_size,
                    shift=j % 2 == 1,
                    pos_grid=pos_grid,
                    linear_window_size=stage_window,
                    alpha=alpha,
                    kernel_size=kernel_size,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    drop=drop_rate,
                    attn_drop=attn_drop_rate,
                    drop_path=dpr[i][j]) for j in range(depths[i])
            ]
            downsample = (
                PatchMerging(dims, 2 * dims) if i < num_stages - 1 else None)
            self.stages.append(SwinStage(blocks, downsample))
            self.num_features.append(dims)
            if i < num_stages - 1:
                dims *= 2
                grid = [s // 2 for s in grid]
        for i in self.out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(self.num_features[i]))
        self._freeze_stages()  # before any optimizer sees the parameters

    def _frozen_modules(self):
        if self.frozen_stages >= 0:
            yield self.patch_embed
        for i in range(self.frozen_stages):
            yield self.stages[i]
            if i in self.out_indices:
                yield getattr(self, f'norm{i}')

    def forward_stages(self, x):
        """Yield the raw (pre-norm, pre-downsampling) output map of every stage."""
        x, hw_shape = self.patch_embed(x)
        x = self.drop_after_pos(x)
        for stage in self.stages:
            for block in stage.blocks:
                x = self._run_block(block, x, hw_shape)
            yield x, hw_shape
            if stage.downsample is not None:
                x, hw_shape = stage.downsample(x, hw_shape)

    def _optional_key(self, key):
        # classification checkpoints hold only the final norm; dense models add the
        # other output norms (and may not use the final one)
        return re.match(r'norm\d+\.', key) is not None

    def _stage_output(self, index, tokens):
        return getattr(self, f'norm{index}')(tokens)
