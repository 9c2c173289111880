"""Pola-PVT: PVT v1 with polarity-aware linear attention, at any input size; and the PVT
family (:data:`FAMILY`: the softmax checkpoints it warm-starts from, its baseline, its
configs)."""
import re
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks import DropPath
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from mmengine.utils import to_2tuple
from torch import Tensor

from ..attention import PolaLinearAttention, SpatialReductionAttention
from ..checkpoint_layouts import Builder, Converted, Layout, identity, matches, rule_target
from ..family import BackboneFamily, config_set, register_family
from ..official_weights import PVT_RULES
from ..utils import (Mlp, PatchEmbed, StagePositionalEncodings, drop_path_rates, nlc_to_nchw,
                     resize_token_grid, run_blocks)
from .base import PolaBackboneBase, check_mlp_ratios, check_stage_list


class PVTBlock(BaseModule):
    """Pre-norm transformer block of PVT v1: ``x + attn(norm1(x))``, then
    ``x + mlp(norm2(x))``, each branch with stochastic depth.

    Args:
        embed_dims (int): Channels C of the tokens.
        num_heads (int): Attention heads (C must be divisible by them).
        mlp_ratio (float): Hidden width of the MLP as a multiple of C.
        attn_type (str): 'L' for :class:`PolaLinearAttention` (PVT projections
            ``qg`` / ``kv``), 'S' for PVT's softmax spatial-reduction attention.
        sr_ratio (int): Spatial reduction of keys/values of an 'S' block.
        la_sr_ratio (int): Spatial reduction of keys/values of an 'L' block.
            Default: 1.
        pos_grid (Sequence[int]): (H0, W0), the token grid at pretraining; an
            'L' block's positional encoding is learned on ``pos_grid / la_sr_ratio``.
            Default: (56, 56).
        alpha (float): Pola exponent ``1 + alpha * sigmoid(power)``. Default: 4.0.
        kernel_size (int): Pola depthwise-conv kernel. Default: 5.
        qkv_bias (bool): Bias of the query/key/value(/gate) projections.
            Default: True.
        drop_rate (float): Dropout after the attention and MLP projections.
            Default: 0.
        attn_drop_rate (float): Dropout on the softmax weights of an 'S' block.
            Default: 0.
        drop_path_rate (float): Stochastic depth of both branches. Default: 0.
        norm_cfg (dict): The two pre-norms. Default: ``dict(type='LN', eps=1e-6)``.
        act_cfg (dict): MLP activation. Default: ``dict(type='GELU')``.
        init_cfg (dict, optional): mmengine initialisation config. Default: None.

    Inputs: tokens (B, H*W, C) and their grid ``hw_shape`` (H, W).
    Output: tokens (B, H*W, C).
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 mlp_ratio: float,
                 attn_type: str,
                 sr_ratio: int,
                 la_sr_ratio: int = 1,
                 pos_grid: Sequence[int] = (56, 56),
                 alpha: float = 4.0,
                 kernel_size: int = 5,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 act_cfg: dict = dict(type='GELU'),
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        if attn_type == 'L':
            self.attn = PolaLinearAttention(
                embed_dims,
                num_heads,
                pos_grid=[s // la_sr_ratio for s in pos_grid],
                sr_ratio=la_sr_ratio,
                kernel_size=kernel_size,
                alpha=alpha,
                qkv_bias=qkv_bias,
                family='pvt',
                proj_drop=drop_rate)
        elif attn_type == 'S':
            self.attn = SpatialReductionAttention(
                embed_dims,
                num_heads,
                sr_ratio=sr_ratio,
                qkv_bias=qkv_bias,
                attn_drop=attn_drop_rate,
                proj_drop=drop_rate)
        else:
            raise ValueError(f"attn_type must be 'L' or 'S', got {attn_type!r}")
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop=drop_rate, act_cfg=act_cfg)

    def forward(self,
                x: Tensor,
                hw_shape: Sequence[int],
                pos_encoding: Optional[Tensor] = None) -> Tensor:
        """``pos_encoding``: an 'L' block's positional encoding already resized to
        the key grid (see :meth:`PVTStage.forward`); None resizes it here."""
        y = self.norm1(x)
        if isinstance(self.attn, PolaLinearAttention):
            y = self.attn(y, hw_shape, pos_encoding=pos_encoding)
        else:
            y = self.attn(y, hw_shape)
        x = x + self.drop_path(y)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PVTStage(BaseModule):
    """One PVT stage: patch embedding, learned absolute position embedding
    (resized bilinearly when the grid differs from ``pos_grid``), blocks.

    Args:
        in_channels (int): Channels of the input map.
        embed_dims (int): Channels C of the stage.
        patch_size (int): Kernel and stride of the patch embedding.
        pos_grid (Sequence[int]): (H0, W0), the stage's grid at pretraining.
        depth (int): Number of :class:`PVTBlock`.
        drop_rate (float): Dropout after the position embedding (and in the
            blocks). Default: 0.
        drop_path_rates (Sequence[float], optional): Stochastic depth per block.
            Default: None (no drop path).
        with_cp (bool): Gradient checkpointing per block. Default: False.
        block_cfg (dict): The other :class:`PVTBlock` arguments (``num_heads``,
            ``mlp_ratio``, ``attn_type``, ``sr_ratio``, ``la_sr_ratio``, ``alpha``,
            ``kernel_size``, ``qkv_bias``, ``attn_drop_rate``, ``norm_cfg``,
            ``act_cfg``).
        init_cfg (dict, optional): mmengine initialisation config. Default: None.

    Input: a map (B, in_channels, H, W). Output: tokens (B, h*w, C) and their grid
    (h, w) = (ceil(H / patch_size), ceil(W / patch_size)).
    """

    def __init__(self,
                 in_channels: int,
                 embed_dims: int,
                 patch_size: int,
                 pos_grid: Sequence[int],
                 depth: int,
                 drop_rate: float = 0.,
                 drop_path_rates: Optional[Sequence[float]] = None,
                 with_cp: bool = False,
                 init_cfg: Optional[dict] = None,
                 **block_cfg):
        super().__init__(init_cfg=init_cfg)
        self.pos_grid = tuple(pos_grid)
        self.with_cp = with_cp
        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_grid[0] * pos_grid[1], embed_dims))
        self.pos_drop = nn.Dropout(drop_rate)
        drop_path_rates = drop_path_rates or [0.] * depth
        self.blocks = nn.ModuleList(
            PVTBlock(
                embed_dims,
                pos_grid=pos_grid,
                drop_rate=drop_rate,
                drop_path_rate=drop_path_rates[j],
                **block_cfg) for j in range(depth))
        self._pos_encodings = StagePositionalEncodings()

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """The stage's tokens and grid for the map ``x`` (see the class docstring)."""
        x, hw_shape = self.patch_embed(x)
        pos = resize_token_grid(self.pos_embed, self.pos_grid, hw_shape, mode='bilinear')
        x = self.pos_drop(x + pos)
        encodings = self._pos_encodings([b.attn for b in self.blocks], hw_shape)
        x = run_blocks(self.blocks, x, hw_shape, self.with_cp, encodings)
        return x, hw_shape


@MODELS.register_module()
class PolaPVT(PolaBackboneBase):
    """Pola-PVT backbone: PVT v1 with polarity-aware linear attention.

    Args:
        arch (str | dict): 'tiny', 'small', 'medium', 'large' (or 't', 's', 'm',
            'l'; the official models), 'nano' (not official: tiny at half the width
            and one block per stage, embed_dims 32-64-160-256, used by the
            quickstart), or a dict with
            ``embed_dims``, ``depths``, ``num_heads``, ``mlp_ratios`` and
            ``sr_ratios`` (one value per stage each; missing keys are an error).
            Default: 'tiny'.
        la_sr_ratios (Sequence[int] | str): Spatial reduction of the keys/values
            of each 'L' stage; '8421' is accepted too. Default: (1, 1, 1, 1), the
            official default.
        attn_types (str): Per stage, 'L' (Pola linear attention) or 'S' (PVT
            softmax spatial-reduction attention with the arch's ``sr_ratios``).
            Default: 'LLLL'.
        alpha (float): Pola exponent ``1 + alpha * sigmoid(power)``; finite and
            > 0. Default: 4.0.
        kernel_size (int): Kernel of the Pola depthwise conv (odd). Default: 5.
        qkv_bias (bool): Bias of the attention projections. Default: True.
        patch_size (int): Patch size of the first stage (the others use 2).
            Default: 4.
        in_channels (int): Image channels. Default: 3.
        pretrain_img_size (int | tuple): Input size the position embeddings and the
            Pola positional encodings were learned at; at other sizes they are
            resized (bilinear / bicubic). Default: 224.
        drop_rate (float): Dropout after embeddings and projections. Default: 0.
        attn_drop_rate (float): Dropout on softmax weights ('S' stages).
            Default: 0.
        drop_path_rate (float): Stochastic depth, rising linearly over the blocks
            to this value. Default: 0.
        norm_cfg (dict): Norms of the blocks. Default:
            ``dict(type='LN', eps=1e-6)`` (official).
        act_cfg (dict): MLP activation. Default: ``dict(type='GELU')``.
        out_indices (Sequence[int] | int): Stages returned as (B, C_i, H_i, W_i) maps,
            strides 4/8/16/32 (ceil for other sizes); an int is one stage.
            Default: (0, 1, 2, 3).
        frozen_stages (int): -1 freezes nothing, 0 the first patch embedding,
            k >= 1 stages 0..k-1 in full. Default: -1.
        norm_eval (bool): Keep BatchNorm layers (if any) in eval mode. Default:
            False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        pretrained (str, optional): Deprecated, as in mmseg; the same as
            ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)``.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=...,
            prefix=...)`` loads official or converted weights (strict); None uses
            the official initialisation. Default: None.

    Input: images (B, in_channels, H, W), any H and W. Output: a tuple of the
    raw stage maps named by ``out_indices`` (channels ``num_features``).
    """

    family = 'pvt'
    arch_zoo: Dict[str, dict] = {
        **dict.fromkeys(['t', 'tiny'], dict(depths=[2, 2, 2, 2])),
        **dict.fromkeys(['s', 'small'], dict(depths=[3, 4, 6, 3])),
        **dict.fromkeys(['m', 'medium'], dict(depths=[3, 4, 18, 3])),
        **dict.fromkeys(['l', 'large'], dict(depths=[3, 8, 27, 3])),
        # not an official model: half of tiny's width and one block per stage, for small
        # images trained from scratch in minutes (the quickstart configs; its time per
        # iteration: docs/advanced_guides/performance.md)
        'nano':
        dict(embed_dims=[32, 64, 160, 256], depths=[1, 1, 1, 1]),
    }
    _arch_defaults = dict(
        embed_dims=[64, 128, 320, 512],
        num_heads=[1, 2, 5, 8],
        mlp_ratios=[8, 8, 4, 4],
        sr_ratios=[8, 4, 2, 1])
    _arch_keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'sr_ratios')
    _arch_stage_lists = ('embed_dims', 'num_heads', 'sr_ratios')

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
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
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
        num_stages = len(arch['depths'])
        self.la_sr_ratios = tuple(
            self._check_pvt_args(arch, la_sr_ratios, grids, to_2tuple(pretrain_img_size)))
        self.arch = arch
        self.num_features = list(arch['embed_dims'])

        dpr = drop_path_rates(drop_path_rate, arch['depths'])
        self.layers = nn.ModuleList()
        prev_dims = in_channels
        for i in range(num_stages):
            self.layers.append(
                PVTStage(
                    prev_dims,
                    arch['embed_dims'][i],
                    patch_size if i == 0 else 2,
                    grids[i],
                    depth=arch['depths'][i],
                    drop_rate=drop_rate,
                    drop_path_rates=dpr[i],
                    with_cp=with_cp,
                    num_heads=arch['num_heads'][i],
                    mlp_ratio=arch['mlp_ratios'][i],
                    attn_type=self.attn_types[i],
                    sr_ratio=arch['sr_ratios'][i],
                    la_sr_ratio=self.la_sr_ratios[i],
                    alpha=alpha,
                    kernel_size=kernel_size,
                    qkv_bias=qkv_bias,
                    attn_drop_rate=attn_drop_rate,
                    norm_cfg=norm_cfg,
                    act_cfg=act_cfg))
            prev_dims = arch['embed_dims'][i]
        self._freeze_stages()  # before any optimizer sees the parameters

    def _check_pvt_args(self, arch: dict, la_sr_ratios, grids: Sequence[Tuple[int, int]],
                        pretrain_img_size: Tuple[int, int]) -> list:
        """The checks of PVT's own arguments (``la_sr_ratios``, the arch's
        ``mlp_ratios``); returns ``la_sr_ratios`` as a list."""
        num_stages = len(arch['depths'])
        la_sr_ratios = check_stage_list('la_sr_ratios', la_sr_ratios, num_stages)
        check_mlp_ratios(arch['mlp_ratios'], num_stages)
        for i in range(num_stages):
            if self.attn_types[i] == 'L' and min(grids[i]) < la_sr_ratios[i]:
                raise ValueError(f'la_sr_ratios[{i}]={la_sr_ratios[i]} exceeds stage {i}\'s grid '
                                 f'{grids[i]} at pretrain_img_size={pretrain_img_size}: its '
                                 'positional encoding would have no tokens')
        return la_sr_ratios

    def _frozen_modules(self):
        if self.frozen_stages >= 0:
            yield self.layers[0].patch_embed
        for i in range(self.frozen_stages):
            yield self.layers[i]

    def forward_stages(self, x: Tensor):
        """Yield (raw stage output tokens (B, h*w, C), (h, w)) for every stage."""
        for stage in self.layers:
            x, hw_shape = stage(x)
            yield x, hw_shape
            x = nlc_to_nchw(x, hw_shape)


# ------------------------------------------------------------------ the PVT family
def _pvt_official(state_dict: Dict[str, Tensor]) -> Converted:
    """whai362/PVT (v1) keys: ``patch_embed1``, ``pos_embed1``, ``block1.0.attn.q`` ...
    (the rules of the official PolaFormer PVT files, whose layout is PVT's); the class
    token, the final norm and the head of the classifier are dropped, and so is the
    class-token row of the last stage's position embedding."""
    out = Builder()
    stages = sorted(int(m[1]) for m in map(re.compile(r'^pos_embed(\d+)$').match, state_dict) if m)
    for key, value in state_dict.items():
        if key in ('cls_token', 'dist_token'):
            out.drop(key, 'class token of the classifier')
        elif key.startswith('head.'):
            out.drop(key, 'classifier head')
        elif key.startswith('norm.'):
            out.drop(key, 'final norm of the classifier')
        elif (len(stages) > 1 and key == f'pos_embed{stages[-1]}'
              and value.shape[1] == state_dict[f'pos_embed{stages[-2]}'].shape[1] // 4 + 1):
            out.put(f'layers.{stages[-1] - 1}.pos_embed', value[:, 1:], key,
                    'class-token row dropped')
        else:
            _, new_key = rule_target(key, PVT_RULES)
            out.put(new_key or key, value, key)
    return out.result()


_MMDET_PVT_BLOCK = [
    ('norm1.', 'norm1.'),
    ('norm2.', 'norm2.'),
    ('attn.attn.out_proj.', 'attn.proj.'),
    ('attn.sr.', 'attn.reduction.sr.'),
    ('attn.norm.', 'attn.reduction.norm.'),
    ('ffn.layers.0.', 'mlp.fc1.'),
    ('ffn.layers.3.', 'mlp.fc2.'),
]


def _pvt_mmdet(state_dict: Dict[str, Tensor]) -> Converted:
    """mmdet's PyramidVisionTransformer keys: ``layers.{i}.0`` patch embedding,
    ``layers.{i}.1.0.pos_embed``, ``layers.{i}.1.{j+1}`` blocks (an
    ``nn.MultiheadAttention`` and 1x1-conv FFN layers)."""
    out = Builder()
    for key, value in state_dict.items():
        match = re.match(r'^layers\.(\d+)\.(0|1\.(\d+))\.(.+)$', key)
        if match is None:
            out.put(key, value, key)
            continue
        stage, block, rest = match[1], match[3], match[4]
        if block is None:  # the patch embedding
            out.put(f'layers.{stage}.patch_embed.{rest.replace("projection.", "proj.", 1)}', value,
                    key)
        elif block == '0' and rest == 'pos_embed':
            out.put(f'layers.{stage}.pos_embed', value, key)
        else:
            prefix = f'layers.{stage}.blocks.{int(block) - 1}.'
            _pvt_mmdet_block(out, prefix, key, rest, value)
    return out.result()


def _pvt_mmdet_block(out: Builder, prefix: str, key: str, rest: str, value: Tensor) -> None:
    """One tensor of an mmdet PVT block, under the twin block ``prefix``."""
    in_proj = re.match(r'^attn\.attn\.in_proj_(weight|bias)$', rest)
    if in_proj:
        dims = value.shape[0] // 3
        out.put(f'{prefix}attn.q.{in_proj[1]}', value[:dims], key, f'rows 0:{dims}')
        out.put(f'{prefix}attn.kv.{in_proj[1]}', value[dims:], key, f'rows {dims}:{3 * dims}')
        return
    for old, new in _MMDET_PVT_BLOCK:
        if rest.startswith(old):
            how = ''
            if new.startswith('mlp.') and value.dim() == 4:
                value, how = value.flatten(1), '1x1 conv weight as a linear one'
            out.put(prefix + new + rest[len(old):], value, key, how)
            return
    out.put(key, value, key)


_PVT_OWN = (r'^layers\.\d+\.patch_embed\.proj\.weight$', r'^layers\.\d+\.blocks\.\d+\.attn\.q\.')
_PVT_V1 = (r'^patch_embed1\.proj\.weight$', r'^pos_embed1$', r'^block1\.\d+\.attn\.q\.weight$')
_PVT_MMDET = (r'^layers\.\d+\.0\.projection\.weight$', r'^layers\.\d+\.1\.0\.pos_embed$',
              r'^layers\.\d+\.1\.\d+\.attn\.attn\.in_proj_weight$')
_PVT_SIZES = {'t': 'tiny', 's': 'small', 'm': 'medium', 'l': 'large'}
# drop path of the Mask R-CNN configs (the lineage's, per size)
_PVT_DROP_PATH = {'t': 0.1, 's': 0.2, 'm': 0.1, 'l': 0.2}


def _pvt_benchmark() -> Dict[str, dict]:
    """Pola-PVT-T/S/M/L beside mmdet's PyramidVisionTransformer of the same size, as the
    Mask R-CNN configs build them."""
    named = {}
    for k, arch in _PVT_SIZES.items():
        named[f'pola-pvt-{k}'] = dict(
            scope=None,
            cfg=dict(
                type='PolaPVT',
                arch=arch,
                attn_types='LLLL',
                drop_path_rate=_PVT_DROP_PATH[k],
                out_indices=(0, 1, 2, 3)),
            config=f'configs/pola_pvt/mask-rcnn_pola-pvt-{k}_fpn_1x_coco.py')
        named[f'pvt-{k}'] = dict(
            scope='mmdet',
            cfg=dict(
                type='PyramidVisionTransformer',
                num_layers=list(PolaPVT.arch_zoo[arch]['depths']),
                drop_path_rate=_PVT_DROP_PATH[k]),
            config=f'configs/pola_pvt/mask-rcnn_pvt-{k}_fpn_1x_coco.py')
    return named


#: the PVT family (:mod:`polaformer_mm.models.family`)
FAMILY = register_family(
    BackboneFamily(
        name='pvt',
        title='PVT v1',
        backbone=PolaPVT,
        layouts=(
            Layout('pvt', 'PolaPVT with softmax stages', lambda k: matches(k, *_PVT_OWN), identity),
            Layout('pvt', 'the official PVT v1 release (whai362/PVT)',
                   lambda k: matches(k, *_PVT_V1), _pvt_official),
            Layout('pvt', "mmdet's PyramidVisionTransformer", lambda k: matches(k, *_PVT_MMDET),
                   _pvt_mmdet),
        ),
        config_name='pvt',
        config_title='PVT',
        config_sizes='[tsml]',
        benchmark=_pvt_benchmark,
        reproduce={
            'mask-rcnn-1x':
            config_set('pola_pvt', 'mask-rcnn_pola-pvt-{}_fpn_1x_coco.py', 'tsml', 'pvt'),
            'retinanet-1x':
            config_set('pola_pvt', 'retinanet_pola-pvt-{}_fpn_1x_coco.py', 'tsml', 'pvt'),
            'semantic-fpn':
            config_set('pola_pvt', 'fpn_pola-pvt-{}_8xb2-40k_ade20k-512x512.py', 'tsml', 'pvt'),
            'cascade-mask-rcnn-3x':
            config_set('pola_pvt',
                       'cascade-mask-rcnn_pola-pvt-{}_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py',
                       'sm', 'pvt'),
            'semantic-fpn-cityscapes':
            config_set('pola_pvt', 'fpn_pola-pvt-{}_4xb2-80k_cityscapes-512x1024.py', 'tsml',
                       'pvt'),
        },
        attention_names=r'(?:^|\.)layers\.(?P<stage>\d+)\.blocks\.(?P<block>\d+)\.attn$'))
