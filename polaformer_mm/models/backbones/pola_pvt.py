"""Pola-PVT: PVT v1 with polarity-aware linear attention, at any input size."""
from typing import Dict, Optional, Sequence, Union

import torch
import torch.nn as nn
from mmcv.cnn.bricks import DropPath
from mmengine.registry import MODELS
from mmengine.utils import to_2tuple

from ..attention import PolaLinearAttention, SpatialReductionAttention
from ..utils import (Mlp, PatchEmbed, drop_path_rates, nlc_to_nchw,
                     resize_token_grid)
from .base import PolaBackboneBase


class PVTBlock(nn.Module):
    """norm1 -> attention -> residual, norm2 -> MLP -> residual (LayerNorm eps 1e-6)."""

    def __init__(self, embed_dims, num_heads, mlp_ratio, attn_type, sr_ratio,
                 la_sr_ratio, pos_grid, alpha, kernel_size, qkv_bias, drop,
                 drop_path):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=1e-6)
        if attn_type == 'L':
            self.attn = PolaLinearAttention(
                embed_dims,
                num_heads,
                pos_grid=[s // la_sr_ratio for s in pos_grid],
                sr_ratio=la_sr_ratio,
                kernel_size=kernel_size,
                alpha=alpha,
                qkv_bias=qkv_bias,
                layout='pvt',
                proj_drop=drop)
        else:
            self.attn = SpatialReductionAttention(
                embed_dims, num_heads, sr_ratio=sr_ratio, qkv_bias=qkv_bias,
                proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop=drop)

    def forward(self, x, hw_shape):
        x = x + self.drop_path(self.attn(self.norm1(x), hw_shape))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PVTStage(nn.Module):
    """Patch embedding + learned absolute position embedding + blocks."""

    def __init__(self, in_channels, embed_dims, patch_size, pos_grid, drop_rate,
                 blocks):
        super().__init__()
        self.pos_grid = tuple(pos_grid)
        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch_size)
        self.pos_embed = nn.Parameter(
            torch.zeros(1, pos_grid[0] * pos_grid[1], embed_dims))
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList(blocks)


@MODELS.register_module()
class PolaPVT(PolaBackboneBase):
    """Pola-PVT backbone (PVT v1 layout with polarity-aware linear attention).

    Args:
        arch (str | dict): 'tiny', 'small', 'medium', 'large', or a dict with
            ``embed_dims, depths, num_heads, mlp_ratios, sr_ratios``.
        la_sr_ratios (Sequence[int] | str): spatial-reduction ratio of each 'L'
            stage (official default 1-1-1-1); '8421' is accepted too.
        attn_types (str): per stage, 'L' (Pola linear attention) or 'S' (PVT
            softmax spatial-reduction attention with ``sr_ratios``).
        alpha (float), kernel_size (int): Pola attention settings.
        pretrain_img_size (int | tuple): input size the position embeddings and
            the Pola positional encodings were learned at; at other sizes they are
            resized (bilinear / bicubic).
        out_indices (Sequence[int]): stages whose raw block outputs are returned as
            (B, C, H_i, W_i) maps, strides 4/8/16/32 (ceil for other sizes).
        frozen_stages (int): -1 freezes nothing, 0 the first patch embedding,
            k >= 1 stages 0..k-1 in full.
        norm_eval (bool): keep BatchNorm layers (if any) in eval mode.
        with_cp (bool): gradient checkpointing per block.
        pretrained (str, optional): deprecated, as in mmseg; the same as
            ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)``.
    """

    kind = 'pvt'
    arch_zoo: Dict[str, dict] = {
        **dict.fromkeys(['t', 'tiny'], dict(depths=[2, 2, 2, 2])),
        **dict.fromkeys(['s', 'small'], dict(depths=[3, 4, 6, 3])),
        **dict.fromkeys(['m', 'medium'], dict(depths=[3, 4, 18, 3])),
        **dict.fromkeys(['l', 'large'], dict(depths=[3, 8, 27, 3])),
    }
    _arch_defaults = dict(
        embed_dims=[64, 128, 320, 512],
        num_heads=[1, 2, 5, 8],
        mlp_ratios=[8, 8, 4, 4],
        sr_ratios=[8, 4, 2, 1])
    _arch_keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'sr_ratios')

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 la_sr_ratios: Union[Sequence[int], str] = (1, 1, 1, 1),
                 attn_types: str = 'LLLL',
                 alpha: float = 4.0,
                 kernel_size: int = 5,
                 qkv_bias: bool = True,
                 patch_size: int = 4,
                 in_channels: int = 3,
                 pretrain_img_size: Union[int, Sequence[int]] = 224,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 pretrained: Optional[str] = None,
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg, pretrained=pretrained)
        arch = self._parse_arch(arch)
        num_stages = len(arch['depths'])
        self._setup_stages(num_stages, attn_types, out_indices, frozen_stages,
                           norm_eval, with_cp)
        attn_types = self.attn_types
        la_sr_ratios = [int(r) for r in la_sr_ratios]
        if len(la_sr_ratios) != num_stages:
            raise ValueError(f'la_sr_ratios needs {num_stages} values, got '
                             f'{la_sr_ratios}')
        pretrain_img_size = to_2tuple(pretrain_img_size)
        self.arch = arch
        self.la_sr_ratios = tuple(la_sr_ratios)
        self.num_features = list(arch['embed_dims'])

        dpr = drop_path_rates(drop_path_rate, arch['depths'])
        grid = [s // patch_size for s in pretrain_img_size]
        self.layers = nn.ModuleList()
        prev_dims = in_channels
        for i in range(num_stages):
            if i > 0:
                grid = [s // 2 for s in grid]
            dims = arch['embed_dims'][i]
            blocks = [
                PVTBlock(
                    dims,
                    arch['num_heads'][i],
                    arch['mlp_ratios'][i],
                    attn_type=attn_types[i],
                    sr_ratio=arch['sr_ratios'][i],
                    la_sr_ratio=la_sr_ratios[i],
                    pos_grid=grid,
                    alpha=alpha,
                    kernel_size=kernel_size,
                    qkv_bias=qkv_bias,
                    drop=drop_rate,
                    drop_path=dpr[i][j]) for j in range(arch['depths'][i])
            ]
            self.layers.append(
                PVTStage(prev_dims, dims, patch_size if i == 0 else 2, grid,
                         drop_rate, blocks))
            prev_dims = dims
        self._freeze_stages()  # before any optimizer sees the parameters

    def _frozen_modules(self):
        if self.frozen_stages >= 0:
            yield self.layers[0].patch_embed
        for i in range(self.frozen_stages):
            yield self.layers[i]

    def forward_stages(self, x):
        """Yield (raw stage output tokens, hw_shape) for every stage."""
        for stage in self.layers:
            x, hw_shape = stage.patch_embed(x)
            pos = resize_token_grid(stage.pos_embed, stage.pos_grid, hw_shape,
                                    mode='bilinear')
            x = stage.pos_drop(x + pos)
            for block in stage.blocks:
                x = self._run_block(block, x, hw_shape)
            yield x, hw_shape
            x = nlc_to_nchw(x, hw_shape)
