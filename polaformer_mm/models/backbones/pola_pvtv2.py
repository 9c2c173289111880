"""Pola-PVTv2: PVTv2 (mmdet's ``PyramidVisionTransformerV2``) with polarity-aware linear
attention, at any input size.

The softmax ('S') parts are mmdet's own modules, imported when a model is built (so that
``import polaformer_mm`` does not import mmdet): the overlapping patch embeddings
(``PatchEmbed``), the encoder layer (``PVTEncoderLayer``) and the depthwise-conv FFN
(``MixFFN``). The state-dict keys are mmdet's.
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.drop import build_dropout
from mmengine.model import BaseModule, ModuleList
from mmengine.model.weight_init import constant_init, normal_init, trunc_normal_init
from mmengine.registry import MODELS
from mmengine.utils import to_2tuple
from torch import Tensor, nn

from ..attention import PolaLinearAttention, split_heads
from ..utils import (StagePositionalEncodings, captured_blocks, check_sizes, drop_path_rates,
                     nchw_to_nlc, nlc_to_nchw, run_blocks, softmax_attention)
from .base import PolaBackboneBase, check_mlp_ratios, check_positive_int, check_stage_list

#: (kernel, stride, padding) of each stage's overlapping patch embedding (PVTv2's)
PATCH_EMBEDS = ((7, 4, 3), (3, 2, 1), (3, 2, 1), (3, 2, 1))


def _mmdet_pvt():
    """mmdet's PVT module (imported on first use: building a PolaPVTv2 needs mmdet)."""
    try:
        from mmdet.models.backbones import pvt
    except ImportError as err:
        raise ImportError('PolaPVTv2 builds on mmdet\'s PVTv2 modules '
                          f'(mmdet.models.backbones.pvt), which could not be imported: {err}; '
                          'install mmdet>=3.3') from err
    return pvt


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


class PVTv2LinearBlock(BaseModule):
    """PVTv2 block with Pola attention ('L'): ``x + drop_path(attn(norm1(x)))``, then
    mmdet's ``MixFFN`` (``x + drop_path(ffn(norm2(x)))``, a depthwise conv between its
    two pointwise convs). Its parameters are those of mmdet's ``PVTEncoderLayer`` but for
    ``attn``.

    Args:
        embed_dims (int): Channels C of the tokens.
        num_heads (int): Attention heads (C must be divisible by them).
        feedforward_channels (int): Hidden channels of the FFN.
        la_sr_ratio (int): Spatial reduction of the keys/values. Default: 1.
        pos_grid (Sequence[int]): (H0, W0), the token grid at pretraining; the
            positional encoding is learned on the key grid there (ceil of
            ``pos_grid / la_sr_ratio``). Default: (56, 56).
        alpha (float): Pola exponent ``1 + alpha * sigmoid(power)``. Default: 4.0.
        kernel_size (int): Pola depthwise-conv kernel. Default: 5.
        qkv_bias (bool): Bias of the query/key/value/gate projections. Default: True.
        drop_rate (float): Dropout after the attention projection and in the FFN.
            Default: 0.
        drop_path_rate (float): Stochastic depth of both branches. Default: 0.
        norm_cfg (dict): The two pre-norms. Default: ``dict(type='LN', eps=1e-6)``.
        act_cfg (dict): FFN activation. Default: ``dict(type='GELU')``.
        init_cfg (dict, optional): mmengine initialisation config. Default: None.

    Inputs: tokens (B, H*W, C), their grid ``hw_shape`` (H, W) and optionally the
    positional encoding already on the key grid. Output: tokens (B, H*W, C).
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 feedforward_channels: int,
                 la_sr_ratio: int = 1,
                 pos_grid: Sequence[int] = (56, 56),
                 alpha: float = 4.0,
                 kernel_size: int = 5,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 act_cfg: dict = dict(type='GELU'),
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = PolaLinearAttention(
            embed_dims,
            num_heads,
            pos_grid=[math.ceil(s / la_sr_ratio) for s in pos_grid],
            sr_ratio=la_sr_ratio,
            kernel_size=kernel_size,
            alpha=alpha,
            qkv_bias=qkv_bias,
            family='pvt',
            proj_drop=drop_rate)
        self.drop_path = build_dropout(dict(type='DropPath', drop_prob=drop_path_rate))
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.ffn = _mmdet_pvt().MixFFN(
            embed_dims=embed_dims,
            feedforward_channels=feedforward_channels,
            ffn_drop=drop_rate,
            dropout_layer=dict(type='DropPath', drop_prob=drop_path_rate),
            use_conv=True,
            act_cfg=act_cfg)

    def forward(self,
                x: Tensor,
                hw_shape: Sequence[int],
                pos_encoding: Optional[Tensor] = None) -> Tensor:
        """``pos_encoding``: the positional encoding already resized to the key grid
        (see :class:`PVTv2Stage`); None resizes it here."""
        x = x + self.drop_path(self.attn(self.norm1(x), hw_shape, pos_encoding=pos_encoding))
        return self.ffn(self.norm2(x), hw_shape, identity=x)


def captured_softmax_block(block: nn.Module, x: Tensor, hw_shape: Sequence[int]) -> Tensor:
    """mmdet's ``PVTEncoderLayer`` (an 'S' block) on tokens ``x`` (B, H*W, C), the same
    maths as its forward in operators of every ONNX opset: the captured form of 'S'
    blocks (torch's ``nn.MultiheadAttention``, which mmdet's attention wraps, records
    ``aten::unflatten`` for separate keys, an opset-13 operator). Its own parameters and
    submodules (spatial reduction, dropouts, drop path, FFN) are used as they are."""
    attn = block.attn
    mha = attn.attn
    y = block.norm1(x)
    kv = y
    if attn.sr_ratio > 1:
        kv = attn.norm(nchw_to_nlc(attn.sr(nlc_to_nchw(y, hw_shape))))
    h = mha.num_heads
    d = mha.embed_dim // h
    weights = mha.in_proj_weight.chunk(3)
    biases = [None] * 3 if mha.in_proj_bias is None else mha.in_proj_bias.chunk(3)
    q, k, v = (split_heads(F.linear(t, w, b), h, d)
               for t, w, b in zip((y, kv, kv), weights, biases))
    out = softmax_attention(q, k, v, d, mha.dropout if mha.training else 0., mha.training)
    out = mha.out_proj(out.transpose(1, 2).flatten(2))
    x = x + attn.dropout_layer(attn.proj_drop(out))
    return block.ffn(block.norm2(x), hw_shape, identity=x)


class PVTv2Stage(ModuleList):
    """One PVTv2 stage as mmdet lays it out: ``[patch_embed, blocks, norm]`` (keys
    ``0.*``, ``1.{j}.*``, ``2.*``), run in turn.

    Args:
        patch_embed (nn.Module): mmdet's overlapping ``PatchEmbed``.
        blocks (Sequence[nn.Module]): mmdet's ``PVTEncoderLayer`` ('S') or
            :class:`PVTv2LinearBlock` ('L').
        norm (nn.Module): The norm after the stage.
        index (int): The stage's index (named in errors).
        sr_ratio (int): The spatial reduction of 'S' blocks, checked against the map
            (mmdet's reduction floors it: a map smaller than it leaves no key); None
            for 'L' stages, which take any map. Under a graph capture 'S' blocks run
            :func:`captured_softmax_block`.
        with_cp (bool): Gradient checkpointing per block. Default: False.

    Input: a map (B, C_in, H, W). Output: normed tokens (B, h*w, C) and their grid (h, w).
    """

    def __init__(self,
                 patch_embed: nn.Module,
                 blocks: Sequence[nn.Module],
                 norm: nn.Module,
                 index: int,
                 sr_ratio: Optional[int],
                 with_cp: bool = False):
        super().__init__([patch_embed, ModuleList(blocks), norm])
        self.index = index
        self.sr_ratio = sr_ratio
        self.with_cp = with_cp
        self._pos_encodings = StagePositionalEncodings()

    def _check_map(self, hw_shape: Sequence[int]) -> Optional[str]:
        r = self.sr_ratio
        if r is None or r <= 1 or min(hw_shape) >= r:
            return None
        side = 2**(self.index + 2) * (r - 1) + 1
        return (f"PolaPVTv2 stage {self.index} is softmax ('S') with sr_ratio {r}, but its map "
                f'is {tuple(hw_shape)}: smaller than the reduction, which leaves no key '
                f'(mmdet\'s PVTv2 fails there too). Feed images of at least {side} pixels '
                f"per side, or make the stage 'L' (attn_types).")

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """The stage's normed tokens and grid for the map ``x``."""
        patch_embed, blocks, norm = self
        x, hw_shape = patch_embed(x)
        check_sizes(lambda: self._check_map(hw_shape))
        encodings = self._pos_encodings([b.attn for b in blocks], hw_shape)
        if self.sr_ratio is not None:
            blocks = captured_blocks(blocks, captured_softmax_block)
        x = run_blocks(blocks, x, hw_shape, self.with_cp, encodings)
        return norm(x), hw_shape


@MODELS.register_module()
class PolaPVTv2(PolaBackboneBase):
    """Pola-PVTv2 backbone: PVTv2 with polarity-aware linear attention.

    PVTv2's structure as mmdet's ``PyramidVisionTransformerV2``: overlapping patch
    embeddings (kernels 7/3/3/3, strides 4/2/2/2, paddings 3/1/1/1), a depthwise-conv FFN
    (``MixFFN``), no absolute position embedding, a norm after each stage. An 'S' stage
    is mmdet's ``PVTEncoderLayer`` (spatial-reduction softmax attention); an 'L' stage
    differs in ``attn`` only, a :class:`PolaLinearAttention` (PVT projections ``qg`` /
    ``kv``). The state-dict keys are mmdet's (``layers.{i}.0.*`` patch embedding,
    ``layers.{i}.1.{j}.*`` blocks, ``layers.{i}.2.*`` stage norm): with ``attn_types='SSSS'``
    the model is mmdet's PVTv2 and loads its state dicts. Building one imports mmdet.

    Args:
        arch (str | dict): 'b0' .. 'b5' (mmdet's ``retinanet_pvtv2-b*`` configs; b0 has
            embed_dims 32-64-160-256, the others 64-128-320-512), or a dict with
            ``embed_dims``, ``depths``, ``num_heads``, ``mlp_ratios`` and ``sr_ratios``
            (one value per stage each; missing keys are an error). Default: 'b2'
            (mmdet's ``PyramidVisionTransformerV2()``).
        la_sr_ratios (Sequence[int] | str): Spatial reduction of the keys/values of
            each 'L' stage (zero-padded to a multiple, so any map works); '8421' is
            accepted too. Default: (1, 1, 1, 1).
        attn_types (str): Per stage, 'L' (Pola linear attention) or 'S' (PVTv2's
            softmax spatial-reduction attention with the arch's ``sr_ratios``; as in
            mmdet, the reduction floors the map, so an 'S' stage needs a map of at least
            ``sr_ratio`` per side: a named error otherwise). Default: 'LLLL'.
        alpha (float): Pola exponent ``1 + alpha * sigmoid(power)``; finite and
            > 0. Default: 4.0.
        kernel_size (int): Kernel of the Pola depthwise conv (odd). Default: 5.
        qkv_bias (bool): Bias of the attention projections. Default: True.
        in_channels (int): Image channels. Default: 3.
        pretrain_img_size (int | tuple): Input size the Pola positional encodings were
            learned at; at other sizes they are resized (bicubic). Default: 224.
        drop_rate (float): Dropout after the attention projections and in the FFNs.
            Default: 0.
        attn_drop_rate (float): Dropout on softmax weights ('S' stages). Default: 0.
        drop_path_rate (float): Stochastic depth, rising linearly over the blocks to
            this value. Default: 0.1 (mmdet's PVTv2 default).
        norm_cfg (dict): Norms of the patch embeddings, blocks and stages. Default:
            ``dict(type='LN', eps=1e-6)`` (mmdet's).
        act_cfg (dict): FFN activation. Default: ``dict(type='GELU')``.
        out_indices (Sequence[int] | int): Stages returned as (B, C_i, H_i, W_i) maps,
            strides 4/8/16/32 (ceil for other sizes); an int is one stage.
            Default: (0, 1, 2, 3).
        frozen_stages (int): -1 freezes nothing, 0 the first patch embedding,
            k >= 1 stages 0..k-1 in full (their norms included). Default: -1.
        norm_eval (bool): Keep BatchNorm layers (if any) in eval mode. Default:
            False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        pretrained (str, optional): Deprecated, as in mmseg; the same as
            ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)``.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=...,
            prefix=...)`` loads (strict) a state dict of this model or of mmdet's PVTv2
            (bare, or a whole model whose backbone keys start with ``prefix``,
            'backbone.' found by itself), or an official PVTv2 file (whai362/PVT
            ``pvt_v2_b*.pth``, converted by mmdet's ``pvt_convert``); None uses
            mmdet's PVTv2 initialisation (the Pola-specific parameters start at zero).
            Default: None.

    Input: images (B, in_channels, H, W), any H and W ('S' stages: see
    ``attn_types``). Output: a tuple of the stage maps named by ``out_indices``
    (channels ``num_features``), each after its stage norm.
    """

    family = 'pvtv2'
    arch_zoo: Dict[str, dict] = {
        'b0': dict(embed_dims=[32, 64, 160, 256], depths=[2, 2, 2, 2]),
        'b1': dict(depths=[2, 2, 2, 2]),
        'b2': dict(depths=[3, 4, 6, 3]),
        'b3': dict(depths=[3, 4, 18, 3]),
        'b4': dict(depths=[3, 8, 27, 3]),
        'b5': dict(depths=[3, 6, 40, 3], mlp_ratios=[4, 4, 4, 4]),
    }
    _arch_defaults = dict(
        embed_dims=[64, 128, 320, 512],
        num_heads=[1, 2, 5, 8],
        mlp_ratios=[8, 8, 4, 4],
        sr_ratios=[8, 4, 2, 1])
    _arch_keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'sr_ratios')
    _arch_stage_lists = ('embed_dims', 'num_heads', 'sr_ratios')

    def __init__(self,
                 arch: Union[str, dict] = 'b2',
                 la_sr_ratios: Union[Sequence[int], str] = (1, 1, 1, 1),
                 attn_types: str = 'LLLL',
                 alpha: float = 4.0,
                 kernel_size: int = 5,
                 qkv_bias: bool = True,
                 in_channels: int = 3,
                 pretrain_img_size: Union[int, Sequence[int]] = 224,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
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
            arch, attn_types, out_indices, frozen_stages, norm_eval, with_cp, PATCH_EMBEDS[0][1],
            in_channels, pretrain_img_size,
            dict(drop_rate=drop_rate, attn_drop_rate=attn_drop_rate, drop_path_rate=drop_path_rate))
        num_stages = len(arch['depths'])
        if num_stages != len(PATCH_EMBEDS):
            raise ValueError(f'PolaPVTv2 has {len(PATCH_EMBEDS)} stages; arch lists have '
                             f'{num_stages} values')
        self.la_sr_ratios = tuple(check_stage_list('la_sr_ratios', la_sr_ratios, num_stages))
        check_mlp_ratios(arch['mlp_ratios'], num_stages)
        self._check_reductions(arch, grids, tuple(to_2tuple(pretrain_img_size)))
        self.arch = arch
        self.num_features = list(arch['embed_dims'])

        dpr = drop_path_rates(drop_path_rate, arch['depths'])
        block_args = dict(
            qkv_bias=qkv_bias, drop_rate=drop_rate, norm_cfg=norm_cfg, act_cfg=act_cfg)
        pola_args = dict(alpha=alpha, kernel_size=kernel_size)
        self.layers = ModuleList()
        prev_dims = in_channels
        for i in range(num_stages):
            self.layers.append(
                self._make_stage(i, prev_dims, grids[i], dpr[i], attn_drop_rate, block_args,
                                 pola_args))
            prev_dims = arch['embed_dims'][i]
        self._freeze_stages()  # before any optimizer sees the parameters

    def _check_reductions(self, arch: dict, grids: Sequence[Tuple[int, int]],
                          pretrain_img_size: Tuple[int, int]) -> None:
        """Every 'L' stage's ``la_sr_ratios`` at most the side of its map at
        ``pretrain_img_size``, else a ValueError naming it: a larger ratio reduces the
        whole map to one key with a convolution of ``C * C * r * r`` weights mostly outside
        the map (``la_sr_ratios=1000`` would build billions of parameters). ('S' stages
        use the arch's ``sr_ratios``, checked against the map they are fed.)"""
        for i, grid in enumerate(grids):
            ratio = self.la_sr_ratios[i]
            if self.attn_types[i] == 'L' and ratio > min(grid):
                dims = arch['embed_dims'][i]
                raise ValueError(
                    f'la_sr_ratios[{i}]={ratio} exceeds the side of stage {i}\'s '
                    f'{grid[0]}x{grid[1]} map at pretrain_img_size={pretrain_img_size}: its '
                    f'reduction convolution would hold {dims * dims * ratio * ratio:,} '
                    f'weights, most of them outside the map. Use a ratio of at most '
                    f'{min(grid)} (or a larger pretrain_img_size).')

    def _make_stage(self, i: int, in_channels: int, grid: Tuple[int, int], dpr: List[float],
                    attn_drop_rate: float, block_args: dict, pola_args: dict) -> PVTv2Stage:
        """Stage ``i``: mmdet's overlapping patch embedding, its blocks ('S': mmdet's
        ``PVTEncoderLayer``; 'L': :class:`PVTv2LinearBlock`), the stage norm."""
        pvt = _mmdet_pvt()
        arch = self.arch
        dims = arch['embed_dims'][i]
        kernel, stride, padding = PATCH_EMBEDS[i]
        patch_embed = pvt.PatchEmbed(
            in_channels=in_channels,
            embed_dims=dims,
            kernel_size=kernel,
            stride=stride,
            padding=padding,
            bias=True,
            norm_cfg=block_args['norm_cfg'])
        common = dict(
            embed_dims=dims,
            num_heads=arch['num_heads'][i],
            feedforward_channels=int(dims * arch['mlp_ratios'][i]),
            **block_args)
        if self.attn_types[i] == 'S':
            blocks = [
                pvt.PVTEncoderLayer(
                    attn_drop_rate=attn_drop_rate,
                    drop_path_rate=rate,
                    sr_ratio=arch['sr_ratios'][i],
                    use_conv_ffn=True,
                    **common) for rate in dpr
            ]
        else:
            blocks = [
                PVTv2LinearBlock(
                    la_sr_ratio=self.la_sr_ratios[i],
                    pos_grid=grid,
                    drop_path_rate=rate,
                    **pola_args,
                    **common) for rate in dpr
            ]
        norm = build_norm_layer(block_args['norm_cfg'], dims)[1]
        sr_ratio = arch['sr_ratios'][i] if self.attn_types[i] == 'S' else None
        return PVTv2Stage(patch_embed, blocks, norm, i, sr_ratio, self.with_cp)

    @staticmethod
    def _stage_grids(pretrain_img_size: Tuple[int, int], patch_size: int,
                     num_stages: int) -> List[Tuple[int, int]]:
        """The token grid of every stage at ``pretrain_img_size``: the output sizes of
        the overlapping patch embeddings (ceil of the size over the stride)."""
        for s in pretrain_img_size:
            check_positive_int('pretrain_img_size', s)
        grids, grid = [], tuple(pretrain_img_size)
        for kernel, stride, padding in PATCH_EMBEDS[:num_stages]:
            grid = tuple(_conv_out(s, kernel, stride, padding) for s in grid)
            grids.append(grid)
        return grids

    def _official_init(self) -> None:
        """mmdet's PVTv2 initialisation, module by module in its order: trunc-normal(0.02)
        linears, unit LayerNorms, convolutions normal with std sqrt(2 / fan_out) (the
        same draws as mmdet's for an all-'S' model built from the same seed); the
        Pola-specific parameters (exponents, scales, positional encodings) stay zero."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_init(m, std=.02, bias=0.)
            elif isinstance(m, nn.LayerNorm):
                constant_init(m, 1.0)
            elif isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                normal_init(m, 0, math.sqrt(2.0 / fan_out))

    def _frozen_modules(self):
        if self.frozen_stages >= 0:
            yield self.layers[0][0]
        for i in range(self.frozen_stages):
            yield self.layers[i]

    def forward_stages(self, x: Tensor):
        """Yield (stage output tokens (B, h*w, C) after the stage norm, (h, w)) for
        every stage."""
        for stage in self.layers:
            x, hw_shape = stage(x)
            yield x, hw_shape
            x = nlc_to_nchw(x, hw_shape)
