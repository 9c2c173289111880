"""Pola-PVTv2: PVTv2 (mmdet's ``PyramidVisionTransformerV2``) with polarity-aware linear
attention, at any input size.

The model is made of mmdet's own modules, imported when a model is built (so that
``import polaformer_mm`` does not import mmdet): the overlapping patch embeddings
(``PatchEmbed``) and the encoder layers (``PVTEncoderLayer``, its depthwise-conv FFN
``MixFFN``). Every block of every stage is a ``PVTEncoderLayer``: as it is in softmax
('S') stages (:class:`PVTv2SoftmaxLayer`), with its attention a
:class:`PVTv2PolaAttention` in Pola ('L') stages (:class:`PVTv2PolaLayer`). The
state-dict keys are mmdet's. The PVTv2 family (:data:`FAMILY`: the softmax checkpoints it
warm-starts from, its baseline, its configs) is declared at the end.
"""
import contextlib
import math
import re
from functools import partial
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.drop import build_dropout
from mmengine.model import ModuleList
from mmengine.model.weight_init import constant_init, normal_init, trunc_normal_init
from mmengine.registry import MODELS
from mmengine.utils import to_2tuple
from torch import Tensor, nn

from ...utils.graph_forms import register_graph_form
from ..attention import AttentionInputs, PolaLinearAttention, head_dims, split_heads
from ..checkpoint_layouts import (Builder, Converted, Layout, classifier_part, identity, lacks,
                                  matches)
from ..family import BackboneFamily, config_set, register_family
from ..utils import (StagePositionalEncodings, check_sizes, drop_path_rates, nchw_to_nlc,
                     nlc_to_nchw, run_blocks, softmax_attention)
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


class PVTv2PolaAttention(PolaLinearAttention):
    """The Pola attention of an 'L' block, with the call of mmdet's PVTv2 attention: its
    ``forward(x, hw_shape, identity=None)`` returns ``identity + dropout_layer(attn(x))``
    (``identity`` None: ``x``), as mmdet's ``SpatialReductionAttention`` does, so that
    mmdet's ``PVTEncoderLayer.forward`` runs it as its own. Its parameters are those of
    :class:`~polaformer_mm.models.attention.PolaLinearAttention` ('pvt' projections).

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads (C must be divisible by them).
        la_sr_ratio (int): Spatial reduction of the keys/values. Default: 1.
        pos_grid (Sequence[int]): (H0, W0), the token grid at pretraining; ``P`` is
            learned on the key grid there (ceil of ``pos_grid / la_sr_ratio``).
            Default: (56, 56).
        drop_path_rate (float): Stochastic depth of the branch (``dropout_layer``, as
            mmdet names it). Default: 0.
        **kwargs: ``alpha``, ``kernel_size``, ``qkv_bias``, ``proj_drop`` of
            :class:`~polaformer_mm.models.attention.PolaLinearAttention`.

    The stage resizes the ``P`` of all its blocks at once and hands each block's to it
    for one call (:meth:`given_positional_encoding`); without one it resizes its own.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 la_sr_ratio: int = 1,
                 pos_grid: Sequence[int] = (56, 56),
                 drop_path_rate: float = 0.,
                 **kwargs):
        super().__init__(
            embed_dims,
            num_heads,
            pos_grid=[math.ceil(s / la_sr_ratio) for s in pos_grid],
            sr_ratio=la_sr_ratio,
            family='pvt',
            **kwargs)
        self.dropout_layer = build_dropout(dict(type='DropPath', drop_prob=drop_path_rate))
        self.stage_encoding: Optional[Tensor] = None

    @contextlib.contextmanager
    def given_positional_encoding(self, encoding: Optional[Tensor]) -> Iterator[None]:
        """Within the ``with`` block the module's calls take ``encoding`` (``P`` already
        on the key grid, e.g. from the stage's
        :class:`~polaformer_mm.models.utils.StagePositionalEncodings`; None: its own
        ``P``, resized where needed) as their positional encoding."""
        # kept out of nn.Module's attribute handling: never registered as a parameter
        self.__dict__['stage_encoding'] = encoding
        try:
            yield
        finally:
            self.__dict__['stage_encoding'] = None

    def residual(self, out: Tensor, x: Tensor, identity: Optional[Tensor]) -> Tensor:
        """``identity + dropout_layer(out)`` (``identity`` None: ``x``), the residual of
        mmdet's attention."""
        return (x if identity is None else identity) + self.dropout_layer(out)

    def forward(self,
                x: Tensor,
                hw_shape: Sequence[int],
                identity: Optional[Tensor] = None) -> Tensor:
        """The attention of tokens ``x`` (B, H*W, C) on ``hw_shape`` added to
        ``identity`` (see the class docstring)."""
        out = super().forward(x, hw_shape, pos_encoding=self.stage_encoding)
        return self.residual(out, x, identity)

    def project(self,
                x: Tensor,
                hw_shape: Sequence[int],
                padding_mask: Optional[Tensor] = None,
                pos_encoding: Optional[Tensor] = None,
                identity: Optional[Tensor] = None) -> AttentionInputs:
        """:meth:`PolaLinearAttention.project
        <polaformer_mm.models.attention.PolaLinearAttention.project>` of the arguments
        of a call (``identity``, the residual, takes no part in the attention)."""
        return super().project(x, hw_shape, padding_mask, pos_encoding)


@register_graph_form(PVTv2PolaAttention)
def pvtv2_pola_attention_graph_form(module: PVTv2PolaAttention,
                                    x: Tensor,
                                    hw_shape: Sequence[int],
                                    identity: Optional[Tensor] = None) -> Tensor:
    """The graph form of :class:`PVTv2PolaAttention`: its forward with the attention laid
    out channels first (:meth:`PolaLinearAttention.forward_channels_first
    <polaformer_mm.models.attention.PolaLinearAttention.forward_channels_first>`)."""
    out = module.forward_channels_first(x, hw_shape, pos_encoding=module.stage_encoding)
    return module.residual(out, x, identity)


def captured_softmax_block(block: nn.Module, x: Tensor, hw_shape: Sequence[int]) -> Tensor:
    """The graph form of the 'S' blocks (:class:`PVTv2SoftmaxLayer`, mmdet's
    ``PVTEncoderLayer``): its forward on tokens ``x`` (B, H*W, C) in operators of every
    ONNX opset (torch's ``nn.MultiheadAttention``, which mmdet's attention wraps,
    records ``aten::unflatten`` for separate keys, an opset-13 operator). Its own
    parameters and submodules (spatial reduction, dropouts, drop path, FFN) are used as
    they are."""
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


#: the layer classes, subclasses of mmdet's PVTEncoderLayer made on first use
_LAYERS: Dict[str, type] = {}


def _pola_layer_class(pvt) -> type:
    """:class:`PVTv2PolaLayer` on mmdet's ``pvt`` module (see :func:`layer_classes`)."""

    class PVTv2PolaLayer(pvt.PVTEncoderLayer):
        """mmdet's ``PVTEncoderLayer`` with its attention a :class:`PVTv2PolaAttention`
        (Pola, the block of an 'L' stage); norms, FFN (``MixFFN``, the depthwise-conv
        FFN) and ``forward`` are mmdet's.

        Args:
            embed_dims (int): Channels C of the tokens.
            num_heads (int): Attention heads (C must be divisible by them).
            feedforward_channels (int): Hidden channels of the FFN.
            la_sr_ratio (int): Spatial reduction of the keys/values. Default: 1.
            pos_grid (Sequence[int]): (H0, W0), the token grid at pretraining.
                Default: (56, 56).
            alpha (float): Pola exponent ``1 + alpha * sigmoid(power)``. Default: 4.0.
            kernel_size (int): Pola depthwise-conv kernel. Default: 5.
            qkv_bias (bool): Bias of the query/key/value/gate projections.
                Default: True.
            drop_rate (float): Dropout after the attention projection and in the
                FFN. Default: 0.
            drop_path_rate (float): Stochastic depth of both branches. Default: 0.
            norm_cfg (dict): The two pre-norms. Default: ``dict(type='LN', eps=1e-6)``.
            act_cfg (dict): FFN activation. Default: ``dict(type='GELU')``.
            init_cfg (dict, optional): mmengine initialisation config. Default: None.

        mmdet's ``__init__`` builds its softmax attention (without reduction), which
        this one replaces.
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
            head_dims(embed_dims, num_heads)  # the named error before mmdet's assert
            super().__init__(
                embed_dims,
                num_heads,
                feedforward_channels,
                drop_rate=drop_rate,
                drop_path_rate=drop_path_rate,
                qkv_bias=qkv_bias,
                act_cfg=act_cfg,
                norm_cfg=norm_cfg,
                use_conv_ffn=True,
                init_cfg=init_cfg)
            self.attn = PVTv2PolaAttention(
                embed_dims,
                num_heads,
                la_sr_ratio=la_sr_ratio,
                pos_grid=pos_grid,
                drop_path_rate=drop_path_rate,
                alpha=alpha,
                kernel_size=kernel_size,
                qkv_bias=qkv_bias,
                proj_drop=drop_rate)

    return PVTv2PolaLayer


def layer_classes() -> Tuple[type, type]:
    """(:class:`PVTv2SoftmaxLayer`, :class:`PVTv2PolaLayer`), the blocks of 'S' and 'L'
    stages: subclasses of mmdet's ``PVTEncoderLayer`` (``forward`` and the state-dict
    keys are mmdet's), defined on first use (it imports mmdet) and then attributes of
    this module like its other classes."""
    if not _LAYERS:
        pvt = _mmdet_pvt()

        class PVTv2SoftmaxLayer(pvt.PVTEncoderLayer):
            """mmdet's ``PVTEncoderLayer`` as it is, the block of an 'S' stage; a class of
            its own so that its graph form (:func:`captured_softmax_block`, for ONNX
            opset 11) is declared for PolaPVTv2's blocks only."""

        PVTv2PolaLayer = _pola_layer_class(pvt)
        for cls in (PVTv2SoftmaxLayer, PVTv2PolaLayer):
            cls.__qualname__ = cls.__name__  # a module attribute (see __getattr__)
        register_graph_form(PVTv2SoftmaxLayer, captured_softmax_block)
        _LAYERS.update(PVTv2SoftmaxLayer=PVTv2SoftmaxLayer, PVTv2PolaLayer=PVTv2PolaLayer)
    return _LAYERS['PVTv2SoftmaxLayer'], _LAYERS['PVTv2PolaLayer']


def __getattr__(name: str):
    """The layer classes (:func:`layer_classes`) as attributes of the module (PEP 562;
    pickling finds them by name too)."""
    if name in ('PVTv2SoftmaxLayer', 'PVTv2PolaLayer'):
        return dict(zip(('PVTv2SoftmaxLayer', 'PVTv2PolaLayer'), layer_classes()))[name]
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def _run_block(block: nn.Module,
               x: Tensor,
               hw_shape: Sequence[int],
               encoding: Optional[Tensor] = None) -> Tensor:
    """``block(x, hw_shape)``, mmdet's layer call, with ``encoding`` (the stage's resized
    ``P`` of the block, or None) given to its Pola attention for the call."""
    if encoding is None:
        return block(x, hw_shape)
    with block.attn.given_positional_encoding(encoding):
        return block(x, hw_shape)


class PVTv2Stage(ModuleList):
    """One PVTv2 stage as mmdet lays it out: ``[patch_embed, blocks, norm]`` (keys
    ``0.*``, ``1.{j}.*``, ``2.*``), run in turn.

    Args:
        patch_embed (nn.Module): mmdet's overlapping ``PatchEmbed``.
        blocks (Sequence[nn.Module]): :class:`PVTv2SoftmaxLayer` ('S') or
            :class:`PVTv2PolaLayer` ('L'), mmdet's ``PVTEncoderLayer`` both.
        norm (nn.Module): The norm after the stage.
        index (int): The stage's index (named in errors).
        sr_ratio (int): The spatial reduction of 'S' blocks, checked against the map
            (mmdet's reduction floors it: a map smaller than it leaves no key); None
            for 'L' stages, which take any map.
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
        calls = [partial(_run_block, b) for b in blocks]
        x = run_blocks(calls, x, hw_shape, self.with_cp, encodings)
        return norm(x), hw_shape


@MODELS.register_module()
class PolaPVTv2(PolaBackboneBase):
    """Pola-PVTv2 backbone: PVTv2 with polarity-aware linear attention.

    PVTv2's structure as mmdet's ``PyramidVisionTransformerV2``: overlapping patch
    embeddings (kernels 7/3/3/3, strides 4/2/2/2, paddings 3/1/1/1), a depthwise-conv FFN
    (``MixFFN``), no absolute position embedding, a norm after each stage. An 'S' stage
    is mmdet's ``PVTEncoderLayer`` (spatial-reduction softmax attention); an 'L' stage
    too, but for its ``attn``, a :class:`PVTv2PolaAttention` (PVT projections ``qg`` /
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
        """Stage ``i``: mmdet's overlapping patch embedding, its blocks ('S':
        :class:`PVTv2SoftmaxLayer`, mmdet's ``PVTEncoderLayer``; 'L':
        :class:`PVTv2PolaLayer`, mmdet's layer with Pola attention), the stage norm."""
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
        softmax_layer, pola_layer = layer_classes()
        if self.attn_types[i] == 'S':
            blocks = [
                softmax_layer(
                    attn_drop_rate=attn_drop_rate,
                    drop_path_rate=rate,
                    sr_ratio=arch['sr_ratios'][i],
                    use_conv_ffn=True,
                    **common) for rate in dpr
            ]
        else:
            blocks = [
                pola_layer(
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


# ------------------------------------------------------------------ the PVTv2 family
def _pvtv2_official(state_dict: Dict[str, Tensor]) -> Converted:
    """whai362/PVT (v2) keys (``patch_embed1``, ``block1.0.attn.q``, ``mlp.dwconv``,
    ``norm1``) by mmdet's own ``pvt_convert`` to mmdet's PyramidVisionTransformerV2
    keys, the twin's (the file key of every tensor found back by its storage; the
    ``in_proj`` joined from ``q`` and ``kv``)."""
    from mmdet.models.backbones.pvt import pvt_convert
    out = Builder()
    owner = {v.data_ptr(): k for k, v in state_dict.items()}
    for key, value in pvt_convert(state_dict).items():
        joined = re.match(r'^layers\.(\d+)\.1\.(\d+)\.attn\.attn\.in_proj_(weight|bias)$', key)
        if joined:
            block = f'block{int(joined[1]) + 1}.{joined[2]}.attn.'
            q, kv = f'{block}q.{joined[3]}', f'{block}kv.{joined[3]}'
            dims = state_dict[q].shape[0]
            out.put(key, value, q, f'rows 0:{dims}, with {kv} as rows {dims}:{3 * dims}')
            out.pieces[key] = [(0, dims, q), (dims, 3 * dims, kv)]
            continue
        source = owner.get(value.data_ptr(), key)
        how = ('linear weight as a 1x1 conv'
               if source in state_dict and state_dict[source].dim() != value.dim() else '')
        out.put(key, value, source, how)
    named = {o[0] for o in out.origin.values()}
    named.update(p[2] for pieces in out.pieces.values() for p in pieces)
    for key in state_dict:
        if key not in named:
            out.drop(key, classifier_part(key))
    return out.result()


def _pvtv2_benchmark() -> Dict[str, dict]:
    """Pola-PVTv2 b0-b2 beside mmdet's PyramidVisionTransformerV2 of the same size."""
    named = {}
    for arch in ('b0', 'b1', 'b2'):
        sizes = {**PolaPVTv2._arch_defaults, **PolaPVTv2.arch_zoo[arch]}
        config = f'configs/pola_pvtv2/mask-rcnn_{{}}pvtv2-{arch}_fpn_1x_coco.py'
        named[f'pola-pvtv2-{arch}'] = dict(
            scope=None,
            cfg=dict(
                type='PolaPVTv2',
                arch=arch,
                attn_types='LLLL',
                drop_path_rate=0.1,
                out_indices=(0, 1, 2, 3)),
            config=config.format('pola-'))
        named[f'pvtv2-{arch}'] = dict(
            scope='mmdet',
            cfg=dict(
                type='PyramidVisionTransformerV2',
                embed_dims=sizes['embed_dims'][0],
                num_layers=list(sizes['depths'])),
            config=config.format(''))
    return named


def _read_pvtv2_release(state_dict: Dict[str, Tensor]) -> Optional[Dict[str, Tensor]]:
    """An official PVTv2 file (whai362/PVT: ``patch_embed1.proj``, ``block1.0.attn.q``) in
    mmdet's PyramidVisionTransformerV2 keys, by mmdet's own ``pvt_convert``, for
    ``init_cfg=dict(type='Pretrained')``; None for any other file."""
    if not any(k.startswith(('patch_embed1.', 'block1.')) for k in state_dict):
        return None
    from mmdet.models.backbones.pvt import pvt_convert
    return dict(pvt_convert(state_dict))


_PVTV2_RELEASE = (r'^patch_embed1\.proj\.weight$', r'^block1\.\d+\.mlp\.dwconv\.')
_PVTV2_OWN = (r'^layers\.\d+\.0\.projection\.weight$', r'^layers\.\d+\.2\.weight$',
              r'^layers\.\d+\.1\.\d+\.ffn\.layers\.1\.weight$')
_PVTV2_SIZES = ('b0', 'b1', 'b2', 'b3', 'b4', 'b5')

#: the PVTv2 family (:mod:`polaformer_mm.models.family`)
FAMILY = register_family(
    BackboneFamily(
        name='pvtv2',
        title='PVTv2',
        backbone=PolaPVTv2,
        layouts=(
            Layout(
                'pvtv2', "mmdet's PyramidVisionTransformerV2 (PolaPVTv2's own keys)",
                lambda k: matches(k, *_PVTV2_OWN) and lacks(k, r'^layers\.\d+\.1\.0\.pos_embed$'),
                identity),
            Layout('pvtv2', 'the official PVTv2 release (whai362/PVT)',
                   lambda k: matches(k, *_PVTV2_RELEASE) and lacks(k, r'^pos_embed1$'),
                   _pvtv2_official),
        ),
        config_name='pvtv2',
        config_title='PVTv2',
        config_sizes='b[0-5]',
        benchmark=_pvtv2_benchmark,
        reproduce={
            'mask-rcnn-1x':
            config_set('pola_pvtv2', 'mask-rcnn_pola-pvtv2-{}_fpn_1x_coco.py', _PVTV2_SIZES,
                       'pvtv2'),
            'retinanet-1x':
            config_set('pola_pvtv2', 'retinanet_pola-pvtv2-{}_fpn_1x_coco.py', _PVTV2_SIZES,
                       'pvtv2'),
            'semantic-fpn':
            config_set('pola_pvtv2', 'fpn_pola-pvtv2-{}_4xb4-80k_ade20k-512x512.py',
                       _PVTV2_SIZES[:3], 'pvtv2'),
        },
        attention_names=r'(?:^|\.)layers\.(?P<stage>\d+)\.1\.(?P<block>\d+)\.attn$',
        read_release=_read_pvtv2_release))
