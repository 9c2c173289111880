"""Pola-Swin: Swin v1 with polarity-aware linear attention stages, at any input size; and
the Swin family (:data:`FAMILY`: the softmax checkpoints it warm-starts from, its
baseline, its configs)."""
import re
from typing import Dict, Iterator, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks import DropPath
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from torch import Tensor

from ..attention import PolaLinearAttention, WindowMSA
from ..checkpoint_layouts import Builder, Converted, Layout, identity, matches, rule_target
from ..family import BackboneFamily, config_set, register_family
from ..official_weights import SWIN_RULES
from ..utils import (Mlp, PatchEmbed, StagePositionalEncodings, drop_path_rates, pad_to_multiple,
                     run_blocks, token_rows, window_layout)
from .base import PolaBackboneBase, check_positive_int


def check_window_fits(window_size: int, attn_types: str, grids: Sequence[Tuple[int, int]],
                      pretrain_img_size) -> None:
    """A ValueError naming ``window_size`` when it is larger than the map of every 'S'
    stage at ``pretrain_img_size`` (``grids``): every window would be mostly padding, and
    softmax attention over it costs the square of its token count (``window_size=100``
    pads a 2x2 map to 10000 tokens attending to 10000). Refused rather than clamped: the
    relative-position table is learned at the configured size, so a clamped window would be
    another model than the config and its checkpoints describe."""
    sides = [max(grids[i]) for i, kind in enumerate(attn_types) if kind == 'S']
    if sides and window_size > max(sides):
        stages = [i for i, kind in enumerate(attn_types) if kind == 'S']
        maps = ', '.join(f'{grids[i][0]}x{grids[i][1]}' for i in stages)
        raise ValueError(
            f'window_size={window_size} is larger than the map of every \'S\' stage '
            f'(stages {stages}: {maps} tokens at pretrain_img_size={pretrain_img_size}): each '
            f'window would be padded to {window_size}x{window_size} tokens, and softmax '
            f'attention over {window_size**2} tokens per window needs memory growing with '
            f'its square. Use window_size <= {max(sides)} (the official models use 7, the '
            '384 Swin-B 12), or set pretrain_img_size to the size the model is trained at')


class SwinBlock(BaseModule):
    """Swin block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``.

    'L' blocks run :class:`PolaLinearAttention` ('swin' projections), either in
    square windows of ``linear_window_size`` (the official form: the map is
    zero-padded to a multiple of the window, shifted blocks roll it by half a
    window when it is larger than the window along both sides, no shift mask is
    applied, padded tokens take no part) or, with ``linear_window_size=None``, over
    the whole map at once (never shifted, ``P`` resized to the map). 'S' blocks run
    window softmax attention with ``window_size``, shifted blocks with the Swin
    shift mask.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Attention heads.
        attn_type (str): 'L' (Pola linear attention) or 'S' (window softmax).
        window_size (int): Window side of an 'S' block. Default: 7.
        shifted (bool): Whether this block shifts its windows (odd blocks of a
            stage). Default: False.
        linear_window_size (int, optional): Window side of an 'L' block; None for
            one window over the whole map. Default: None.
        pos_grid (Sequence[int]): Grid of the 'L' block's positional encoding:
            the window, or for the global form the stage's grid at pretraining.
            Default: (56, 56).
        alpha (float): Pola exponent ``1 + alpha * sigmoid(power)``. Default: 4.0.
        kernel_size (int): Pola depthwise-conv kernel. Default: 5.
        mlp_ratio (float): Hidden width of the MLP as a multiple of C. Default: 4.
        qkv_bias (bool): Bias of the attention projections. Default: True.
        drop_rate (float): Dropout after the projections. Default: 0.
        attn_drop_rate (float): Dropout on softmax weights ('S'). Default: 0.
        drop_path_rate (float): Stochastic depth of both branches. Default: 0.
        norm_cfg (dict): The two pre-norms. Default: ``dict(type='LN')``.
        act_cfg (dict): MLP activation. Default: ``dict(type='GELU')``.
        init_cfg (dict, optional): mmengine initialisation config. Default: None.

    Inputs: tokens (B, H*W, C) and ``hw_shape`` (H, W); for a global 'L' block
    optionally its positional encoding resized to (H, W). Output: (B, H*W, C).
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 attn_type: str,
                 window_size: int = 7,
                 shifted: bool = False,
                 linear_window_size: Optional[int] = None,
                 pos_grid: Sequence[int] = (56, 56),
                 alpha: float = 4.0,
                 kernel_size: int = 5,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 norm_cfg: dict = dict(type='LN'),
                 act_cfg: dict = dict(type='GELU'),
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if attn_type not in ('L', 'S'):
            raise ValueError(f"attn_type must be 'L' or 'S', got {attn_type!r}")
        self.uses_pola = attn_type == 'L'
        self.shifted = bool(shifted)
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        if self.uses_pola:
            # None: one global window; an int: windows whose grid is also P's
            self.window_size = linear_window_size
            self.attn = PolaLinearAttention(
                embed_dims,
                num_heads,
                pos_grid=pos_grid,
                kernel_size=kernel_size,
                alpha=alpha,
                qkv_bias=qkv_bias,
                family='swin',
                proj_drop=drop_rate)
        else:
            self.window_size = window_size
            self.attn = WindowMSA(
                embed_dims,
                num_heads,
                window_size,
                qkv_bias=qkv_bias,
                attn_drop=attn_drop_rate,
                proj_drop=drop_rate)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop=drop_rate, act_cfg=act_cfg)

    @property
    def pola_windows(self) -> bool:
        """Whether the block's Pola attention attends within windows: it takes the
        windows of the map as its batch, which an export runs one window at a time
        (:mod:`polaformer_mm.deployment.window_scan`)."""
        return self.uses_pola and self.window_size is not None

    def _window_attention(self, x: Tensor, hw_shape: Sequence[int]) -> Tensor:
        """Attention within the (shifted) square windows of the map (``window_size``),
        the layout and masks of :func:`~polaformer_mm.models.utils.window_layout`: the
        map padded to multiples of the window, rolled and laid out as windows in one
        gather, and back."""
        H, W = hw_shape
        B, N, C = x.shape
        ws = self.window_size
        layout = window_layout(
            hw_shape, ws, self.shifted, x.device, x.dtype, softmax_mask=not self.uses_pola)
        x = pad_to_multiple(x.view(B, H, W, C).permute(0, 3, 1, 2), ws).permute(0, 2, 3, 1)
        windows = x.reshape(B, -1, C).index_select(1, layout.to_windows).view(-1, ws * ws, C)
        if self.uses_pola:
            padding = None if layout.padding is None else layout.padding.repeat(B, 1)
            windows = self.attn(windows, (ws, ws), padding_mask=padding)
        else:
            windows = self.attn(windows, layout.mask)
        return windows.view(B, -1, C).index_select(1, layout.from_windows)

    def forward(self,
                x: Tensor,
                hw_shape: Sequence[int],
                pos_encoding: Optional[Tensor] = None) -> Tensor:
        """The block on tokens (B, H*W, C) (see the class docstring)."""
        y = self.norm1(x)
        if self.uses_pola and self.window_size is None:
            y = self.attn(y, hw_shape, pos_encoding=pos_encoding)
        else:
            y = self._window_attention(y, hw_shape)
        x = x + self.drop_path(y)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(BaseModule):
    """Swin downsampling: 2x2 neighbourhood concat ([0::2, 0::2], [1::2, 0::2],
    [0::2, 1::2], [1::2, 1::2]), norm(4C), Linear(4C, out, no bias). Odd sides are
    zero-padded.

    Args:
        in_dims (int): Input channels C.
        out_dims (int): Output channels (2C in Swin).
        norm_cfg (dict): Norm before the reduction. Default: ``dict(type='LN')``.
        init_cfg (dict, optional): mmengine initialisation config. Default: None.

    Input: tokens (B, H*W, C) and (H, W). Output: tokens (B, h*w, out_dims) and
    (h, w) = (ceil(H / 2), ceil(W / 2)).
    """

    def __init__(self,
                 in_dims: int,
                 out_dims: int,
                 norm_cfg: dict = dict(type='LN'),
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        self.norm = build_norm_layer(norm_cfg, 4 * in_dims)[1]
        self.reduction = nn.Linear(4 * in_dims, out_dims, bias=False)

    def forward(self, x: Tensor, hw_shape: Sequence[int]) -> Tuple[Tensor, Tuple[int, int]]:
        """Merged tokens and their grid (see the class docstring)."""
        H, W = hw_shape
        B, N, C = x.shape
        x = pad_to_multiple(x.view(B, H, W, C).permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]],
                      dim=-1)
        hw_shape = (x.shape[1], x.shape[2])
        x = x.reshape(B, -1, 4 * C)
        return token_rows(self.reduction, self.norm(x)), hw_shape


class SwinStage(BaseModule):
    """One Swin stage: ``depth`` :class:`SwinBlock` (odd ones shifted), then an
    optional :class:`PatchMerging`.

    Args:
        embed_dims (int): Channels C of the stage.
        depth (int): Number of blocks.
        downsample (bool): End with a PatchMerging to 2C channels. Default: False.
        drop_path_rates (Sequence[float], optional): Stochastic depth per block.
            Default: None (no drop path).
        with_cp (bool): Gradient checkpointing per block. Default: False.
        norm_cfg (dict): Norms of the blocks and the downsampling. Default:
            ``dict(type='LN')``.
        init_cfg (dict, optional): mmengine initialisation config. Default: None.
        **block_cfg: The other :class:`SwinBlock` arguments (``num_heads``,
            ``attn_type``, ``window_size``, ``linear_window_size``, ``pos_grid``,
            ``alpha``, ``kernel_size``, ``mlp_ratio``, ``qkv_bias``, ``drop_rate``,
            ``attn_drop_rate``, ``act_cfg``).

    Input: tokens (B, H*W, C) and (H, W). Output: the stage's tokens and grid
    before downsampling, then the downsampled tokens and grid (the same ones when
    there is no downsampling), as mmdet's ``SwinBlockSequence``.
    """

    def __init__(self,
                 embed_dims: int,
                 depth: int,
                 downsample: bool = False,
                 drop_path_rates: Optional[Sequence[float]] = None,
                 with_cp: bool = False,
                 norm_cfg: dict = dict(type='LN'),
                 init_cfg: Optional[dict] = None,
                 **block_cfg):
        super().__init__(init_cfg=init_cfg)
        self.with_cp = with_cp
        drop_path_rates = drop_path_rates or [0.] * depth
        self.blocks = nn.ModuleList(
            SwinBlock(
                embed_dims,
                shifted=j % 2 == 1,
                drop_path_rate=drop_path_rates[j],
                norm_cfg=norm_cfg,
                **block_cfg) for j in range(depth))
        self.downsample = (
            PatchMerging(embed_dims, 2 * embed_dims, norm_cfg=norm_cfg) if downsample else None)
        self._pos_encodings = StagePositionalEncodings()

    def forward(self, x: Tensor,
                hw_shape: Sequence[int]) -> Tuple[Tensor, Tuple[int, int], Tensor, Tuple[int, int]]:
        """The stage's output and grid, and the downsampled ones (see the class
        docstring)."""
        global_blocks = [
            b.attn if b.uses_pola and b.window_size is None else None for b in self.blocks
        ]
        encodings = self._pos_encodings(global_blocks, hw_shape)
        x = run_blocks(self.blocks, x, hw_shape, self.with_cp, encodings)
        hw_shape = tuple(hw_shape)
        if self.downsample is None:
            return x, hw_shape, x, hw_shape
        x_down, down_hw = self.downsample(x, hw_shape)
        return x, hw_shape, x_down, down_hw


@MODELS.register_module()
class PolaSwin(PolaBackboneBase):
    """Pola-Swin backbone: Swin v1 with Pola linear-attention stages.

    Args:
        arch (str | dict): 'tiny', 'small', 'base' (or 't', 's', 'b'), or a dict
            with ``embed_dims`` (int, first stage), ``depths`` and ``num_heads``
            (one value per stage). Default: 'tiny'.
        attn_types (str): Per stage, 'L' (Pola linear attention) or 'S' (shifted
            window softmax attention with ``window_size``). Default: 'LLSS'.
        window_size (int): Window of the 'S' stages (12 for the official 384
            Swin-B, whose ``linear_window_size`` is 96). Default: 7.
        linear_window_size (int | None): Window of the 'L' stages. An int gives
            each 'L' stage a square window of ``min(linear_window_size, the
            stage's grid at pretrain_img_size)`` (56 and 28 for the 224 models,
            96 and 48 for the 384 Swin-B), the official classifier's computation
            (the ImageNet configs); None gives one window over the whole map,
            unshifted and unpadded, ``P`` resized to it: the dense form of the
            lineage's downstream code, which every dense config uses. How both forms
            run at any input size: docs/user_guides/config.md, "Any input size".
            Default: 56.
        pretrain_img_size (int | tuple): Input size at pretraining; sets the stage
            grids (56x56, 28x28, ... at 224) the windows and the positional
            encodings of the 'L' stages derive from. Default: 224.
        patch_size (int): Patch size of the patch embedding. Default: 4.
        in_channels (int): Image channels. Default: 3.
        mlp_ratio (float): Hidden width of the MLPs. Default: 4.
        qkv_bias (bool): Bias of the attention projections. Default: True.
        alpha (float): Pola exponent ``1 + alpha * sigmoid(power)``; finite and
            > 0. Default: 4.0.
        kernel_size (int): Kernel of the Pola depthwise conv (odd). Default: 5.
        drop_rate (float): Dropout after the embedding and projections. Default: 0.
        attn_drop_rate (float): Dropout on softmax weights ('S'). Default: 0.
        drop_path_rate (float): Stochastic depth, rising linearly over the blocks
            to this value. Default: 0.1.
        norm_cfg (dict): Every norm (patch embedding, blocks, downsampling, output
            norms). Default: ``dict(type='LN')`` (official).
        act_cfg (dict): MLP activation. Default: ``dict(type='GELU')``.
        out_indices (Sequence[int] | int): Stages returned, each after its norm
            ``norm{i}`` (``norm3`` is the official final norm), as (B, C_i, H_i,
            W_i) maps with C, 2C, 4C, 8C channels; an int is one stage.
            Default: (0, 1, 2, 3).
        frozen_stages (int): -1 freezes nothing, 0 the patch embedding, k >= 1
            also stages 0..k-1 (with their downsampling and output norms).
            Default: -1.
        norm_eval (bool): Keep BatchNorm layers (if any) in eval mode. Default:
            False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        pretrained (str, optional): Deprecated, as in mmseg; the same as
            ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)``.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=...,
            prefix=...)`` loads official or converted weights (strict but for the
            output norms); None uses the official initialisation. Default: None.

    Input: images (B, in_channels, H, W), any H and W.
    """

    family = 'swin'
    arch_zoo: Dict[str, dict] = {
        **dict.fromkeys(['t', 'tiny'],
                        dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])),
        **dict.fromkeys(['s', 'small'],
                        dict(embed_dims=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24])),
        **dict.fromkeys(['b', 'base'],
                        dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32])),
    }
    _arch_keys = ('embed_dims', 'depths', 'num_heads')
    _arch_stage_lists = ('num_heads', )

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
                 norm_cfg: dict = dict(type='LN'),
                 act_cfg: dict = dict(type='GELU'),
                 out_indices: Union[int, Sequence[int]] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 pretrained: Optional[str] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg, pretrained=pretrained)
        arch, grids = self._check_common_args(
            arch, attn_types, out_indices, frozen_stages, norm_eval, with_cp, patch_size,
            in_channels, pretrain_img_size,
            dict(drop_rate=drop_rate, attn_drop_rate=attn_drop_rate, drop_path_rate=drop_path_rate))
        check_positive_int('arch embed_dims', arch['embed_dims'])
        check_positive_int('window_size', window_size)
        check_window_fits(window_size, self.attn_types, grids, pretrain_img_size)
        if linear_window_size is not None:
            linear_window_size = check_positive_int('linear_window_size', linear_window_size)
        if not mlp_ratio > 0:
            raise ValueError(f'mlp_ratio must be > 0, got {mlp_ratio}')
        self.arch = arch
        self.linear_window_size = linear_window_size

        self.patch_embed = PatchEmbed(
            in_channels, arch['embed_dims'], patch_size, norm_cfg=norm_cfg)
        self.drop_after_pos = nn.Dropout(drop_rate)
        self._build_stages(
            grids,
            drop_path_rates(drop_path_rate, arch['depths']),
            with_cp=with_cp,
            norm_cfg=norm_cfg,
            window_size=window_size,
            alpha=alpha,
            kernel_size=kernel_size,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            act_cfg=act_cfg)
        for i in self.out_indices:
            self.add_module(f'norm{i}', build_norm_layer(norm_cfg, self.num_features[i])[1])
        self._freeze_stages()  # before any optimizer sees the parameters

    def _build_stages(self, grids: Sequence[Tuple[int, int]], dpr: Sequence[Sequence[float]],
                      **stage_cfg) -> None:
        """``self.stages`` (channels doubling from ``arch['embed_dims']``) and
        ``self.num_features``; each 'L' stage's window and positional-encoding grid
        follow from ``linear_window_size`` and the stage's grid at pretraining
        (``grids``); ``stage_cfg``: the arguments every :class:`SwinStage` shares."""
        depths, num_heads = self.arch['depths'], self.arch['num_heads']
        num_stages = len(depths)
        dims = self.arch['embed_dims']
        self.num_features = []
        self.stages = nn.ModuleList()
        for i in range(num_stages):
            if self.linear_window_size is None:
                stage_window, pos_grid = None, grids[i]
            else:
                stage_window = min(self.linear_window_size, *grids[i])
                pos_grid = (stage_window, stage_window)
            self.stages.append(
                SwinStage(
                    dims,
                    depths[i],
                    downsample=i < num_stages - 1,
                    drop_path_rates=dpr[i],
                    num_heads=num_heads[i],
                    attn_type=self.attn_types[i],
                    linear_window_size=stage_window,
                    pos_grid=pos_grid,
                    **stage_cfg))
            self.num_features.append(dims)
            dims *= 2

    def _frozen_modules(self) -> Iterator[nn.Module]:
        if self.frozen_stages >= 0:
            yield self.patch_embed
        for i in range(self.frozen_stages):
            yield self.stages[i]
            if i in self.out_indices:
                yield getattr(self, f'norm{i}')

    def forward_stages(self, x: Tensor):
        """Yield the raw (pre-norm, pre-downsampling) tokens (B, h*w, C) and (h, w)
        of every stage."""
        x, hw_shape = self.patch_embed(x)
        x = self.drop_after_pos(x)
        for stage in self.stages:
            out, out_hw, x, hw_shape = stage(x, hw_shape)
            yield out, out_hw

    def _optional_key(self, key: str) -> bool:
        # classification checkpoints hold only the final norm; dense models add the
        # other output norms (and may not use the final one)
        return re.match(r'norm\d+\.', key) is not None

    def _stage_output(self, index: int, tokens: Tensor) -> Tensor:
        return getattr(self, f'norm{index}')(tokens)


# ------------------------------------------------------------------ the Swin family
def _swin_official(state_dict: Dict[str, Tensor]) -> Converted:
    """microsoft/Swin-Transformer keys: ``patch_embed.proj``, ``layers.{i}.blocks.{j}``
    (``attn.qkv``, ``mlp.fc1``), ``layers.{i}.downsample``, ``norm``, ``head`` (the
    rules of the official PolaFormer Swin files, whose layout is Swin's)."""
    out = Builder()
    num_stages = 1 + max(
        (int(m[1]) for m in map(re.compile(r'^layers\.(\d+)\.').match, state_dict) if m),
        default=-1)
    for key, value in state_dict.items():
        if key.startswith('head.'):
            out.drop(key, 'classifier head')
        elif key.startswith('norm.'):
            out.put(f'norm{num_stages - 1}.{key[len("norm."):]}', value, key)
        else:
            matched, new_key = rule_target(key, SWIN_RULES)
            if matched and new_key is None:
                out.drop(key, 'buffer (the model rebuilds it)')
            else:
                out.put(new_key or key, value, key)
    return out.result()


def _unfold_inverse(channels: int, kind: str) -> Tensor:
    """The channel order that undoes mmdet's ``swin_converter`` reordering of a patch
    merging ``kind`` ('reduction' or 'norm') of ``channels`` (4C) input channels:
    mmdet's and mmpretrain's PatchMerging gather the 2x2 neighbourhood with
    ``nn.Unfold``, the official one (and the twin) by concatenation."""
    from mmdet.models.backbones.swin import swin_converter
    index = torch.arange(channels, dtype=torch.float64)
    key = f'layers.0.downsample.{kind}.weight'
    moved = swin_converter({key: index[None] if kind == 'reduction' else index})
    order = moved[f'backbone.stages.0.downsample.{kind}.weight'].reshape(-1).long()
    return torch.argsort(order)


def _swin_mm(state_dict: Dict[str, Tensor]) -> Converted:
    """mmdet's / mmpretrain's SwinTransformer keys: ``patch_embed.projection``,
    ``stages.{i}.blocks.{j}`` (``attn.w_msa.qkv``, ``ffn.layers.0.0``,
    ``ffn.layers.1``), ``stages.{i}.downsample`` (unfold channel order),
    ``norm{i}``."""
    out = Builder()
    renames = [('attn.w_msa.', 'attn.'), ('ffn.layers.0.0.', 'mlp.fc1.'),
               ('ffn.layers.1.', 'mlp.fc2.')]
    for key, value in state_dict.items():
        block = re.match(r'^(stages\.\d+\.blocks\.\d+\.)(.+)$', key)
        merge = re.match(r'^stages\.\d+\.downsample\.(reduction|norm)\.(weight|bias)$', key)
        if key.endswith('relative_position_index'):
            out.drop(key, 'buffer (the model rebuilds it)')
        elif key.startswith('patch_embed.projection.'):
            out.put(key.replace('projection.', 'proj.', 1), value, key)
        elif block:
            rest = block[2]
            for old, new in renames:
                if rest.startswith(old):
                    rest = new + rest[len(old):]
                    break
            out.put(block[1] + rest, value, key)
        elif merge:
            order = _unfold_inverse(value.shape[-1], merge[1])
            out.put(key, value[..., order], key,
                    'input channels from the unfold order to the official one')
        else:
            out.put(key, value, key)
    return out.result()


_SWIN_OWN = (r'^patch_embed\.proj\.weight$', r'^stages\.\d+\.blocks\.\d+\.attn\.qkv\.weight$')
_SWIN_OFFICIAL = (r'^patch_embed\.proj\.weight$', r'^layers\.\d+\.blocks\.\d+\.attn\.qkv\.weight$')
_SWIN_MM = (r'^patch_embed\.projection\.weight$',
            r'^stages\.\d+\.blocks\.\d+\.attn\.w_msa\.qkv\.weight$')
_SWIN_SIZES = {'t': 'tiny', 's': 'small', 'b': 'base'}
# drop path as in the configs: Mask R-CNN 0.1 (t, s), UperNet 0.5 (b, the only size with no
# detection config)
_SWIN_DROP_PATH = {'t': 0.1, 's': 0.1, 'b': 0.5}


def _swin_benchmark() -> Dict[str, dict]:
    """Pola-Swin-T/S/B beside mmdet's SwinTransformer of the same size, as the Mask R-CNN
    (T, S) and UperNet (B) configs build them ('L' stages over the whole map)."""
    named = {}
    for k, arch in _SWIN_SIZES.items():
        config = ('configs/pola_swin/upernet_{}swin-b_8xb2-160k_ade20k-512x512.py' if k == 'b' else
                  'configs/pola_swin/mask-rcnn_{}swin-%s-p4-w7_fpn_ms-crop-1x_coco.py' % k)
        common = dict(window_size=7, drop_path_rate=_SWIN_DROP_PATH[k], out_indices=(0, 1, 2, 3))
        named[f'pola-swin-{k}'] = dict(
            scope=None,
            cfg=dict(
                type='PolaSwin', arch=arch, attn_types='LLSS', linear_window_size=None, **common),
            config=config.format('pola-'))
        sizes = {
            key: list(v) if isinstance(v, (list, tuple)) else v
            for key, v in PolaSwin.arch_zoo[arch].items()
        }
        named[f'swin-{k}'] = dict(
            scope='mmdet',
            cfg=dict(
                type='SwinTransformer',
                **sizes,
                mlp_ratio=4,
                qkv_bias=True,
                qk_scale=None,
                drop_rate=0.,
                attn_drop_rate=0.,
                patch_norm=True,
                with_cp=False,
                **common),
            config=config.format(''))
    return named


def _swin_configs(task: str, pattern: str, sizes: str) -> Tuple[str, Dict[str, str]]:
    return task, config_set('pola_swin', pattern, sizes, 'swin')


#: the Swin family (:mod:`polaformer_mm.models.family`)
FAMILY = register_family(
    BackboneFamily(
        name='swin',
        title='Swin',
        backbone=PolaSwin,
        layouts=(
            Layout('swin', 'PolaSwin with softmax stages', lambda k: matches(k, *_SWIN_OWN),
                   identity),
            Layout('swin', 'the official Swin release (microsoft/Swin-Transformer)',
                   lambda k: matches(k, *_SWIN_OFFICIAL), _swin_official),
            Layout('swin', "mmdet's / mmpretrain's SwinTransformer",
                   lambda k: matches(k, *_SWIN_MM), _swin_mm),
        ),
        config_name='swin',
        config_title='Swin',
        config_sizes='[tsb]',
        benchmark=_swin_benchmark,
        reproduce=dict([
            _swin_configs('mask-rcnn-1x', 'mask-rcnn_pola-swin-{}-p4-w7_fpn_ms-crop-1x_coco.py',
                          'ts'),
            _swin_configs('mask-rcnn-3x', 'mask-rcnn_pola-swin-{}-p4-w7_fpn_ms-crop-3x_coco.py',
                          'ts'),
            _swin_configs('upernet', 'upernet_pola-swin-{}_8xb2-160k_ade20k-512x512.py', 'tsb'),
            _swin_configs(
                'cascade-mask-rcnn-3x',
                'cascade-mask-rcnn_pola-swin-{}-p4-w7_fpn_4conv1fc-giou_ms-crop-3x_coco.py', 'ts'),
            _swin_configs('mask2former-coco',
                          'mask2former_pola-swin-{}-p4-w7-224_8xb2-lsj-50e_coco.py', 'ts'),
            _swin_configs('mask2former-coco-panoptic',
                          'mask2former_pola-swin-{}-p4-w7-224_8xb2-lsj-50e_coco-panoptic.py', 'ts'),
            _swin_configs('mask2former-ade20k',
                          'mask2former_pola-swin-{}_8xb2-160k_ade20k-512x512.py', 'ts'),
            _swin_configs('mask2former-cityscapes',
                          'mask2former_pola-swin-{}_8xb2-90k_cityscapes-512x1024.py', 'ts'),
            _swin_configs('upernet-cityscapes',
                          'upernet_pola-swin-{}_4xb2-80k_cityscapes-512x1024.py', 'ts'),
        ]),
        attention_names=r'(?:^|\.)stages\.(?P<stage>\d+)\.blocks\.(?P<block>\d+)\.attn$'))
