"""Pola-DeiT: mmpretrain's plain ViT at the DeiT sizes with polarity-aware linear
attention, at any input size; and the DeiT / ViT family (:data:`FAMILY`: the softmax
checkpoints it warm-starts from, its baseline, its configs)."""
import logging
import math
import re
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath
from mmcv.cnn.bricks.transformer import FFN, PatchEmbed
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import MODELS
from mmengine.utils import to_2tuple
from mmpretrain.models.backbones.vision_transformer import (TransformerEncoderLayer,
                                                            VisionTransformer)
from mmpretrain.models.utils import build_norm_layer
from torch import Tensor

from ...ops import pola_linear_attention
from ...ops.pola_attention import pola_linear_attention_channels_first
from ...utils.graph_forms import register_graph_form
from ..attention import (AttentionInputs, PolaLinearAttention, channels_first_projection,
                         linear_parts, merge_heads, split_heads, with_ones)
from ..checkpoint_layouts import Builder, Converted, Layout, matches
from ..family import BackboneFamily, config_set, register_family
from ..utils import (StagePositionalEncodings, check_sizes, drop_path_rates, nlc_to_nchw,
                     pad_for_patches, pad_to_multiple, resize_token_grid, run_blocks,
                     softmax_attention)
from .base import PolaBackboneBase, check_positive_int, check_probability, is_int

#: The interpolation modes of the position embeddings (separable, see
#: :func:`~polaformer_mm.models.utils.resize_token_grid`).
INTERPOLATE_MODES = ('bicubic', 'bilinear')

#: The state-dict key (relative to the backbone) of the patch grid ``[H, W]`` that the
#: position embedding and every 'L' positional encoding lie on, written where the grid is
#: not square: the tables alone do not tell a 16x4 grid from an 8x8 one.
GRID_KEY = 'pos_grid'


class ViTPatchEmbed(PatchEmbed):
    """mmcv's ``PatchEmbed`` as mmpretrain's ViT builds it (a conv with kernel = stride,
    'corner' padding: the bottom / right zero-padded to a multiple of the patch, so the
    grid is ``ceil(H / patch)``), its padding done by
    :func:`~polaformer_mm.models.utils.pad_for_patches` so that a captured graph pads
    for any input size (by :func:`~polaformer_mm.models.utils.pad_to_multiple` for a
    kernel other than the stride).

    Input: images (B, C, H, W). Output: tokens (B, h*w, embed_dims) and (h, w).
    """

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """Patch tokens and their grid."""
        conv = self.projection
        stride = conv.stride[0]
        if tuple(conv.kernel_size) == tuple(conv.stride) == (stride, stride):
            x = conv(pad_for_patches(x, stride))
        else:
            x = conv(pad_to_multiple(x, stride))
        return x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3])


class PolaViTAttention(PolaLinearAttention):
    """Pola attention over a class token and a grid of patch tokens.

    A :class:`~polaformer_mm.models.attention.PolaLinearAttention` of the 'swin'
    family (one ``qkvg`` projection, ``proj``, ``dwc``, ``power``, ``scale``,
    ``positional_encoding`` on the patch grid), without parameters of its own. All
    tokens share the projections, the gate and the output projection; they differ in
    how they attend:

    * a patch token's query attends by the Pola op (linear cost) to the keys and
      values of all 1 + H*W tokens (the class token's key carries no positional
      encoding), plus the local term (the depthwise conv of the patch values on the
      grid);
    * the class token's query attends by softmax (``q k^T / sqrt(d)``) to the same
      keys and values: one query, so its exact softmax costs O(H*W), as little as
      the Pola op's; it has no local term (it is not on the grid).

    Input: tokens (B, 1 + H*W, C), the class token first, and the patch grid
    ``hw_shape`` (H, W). Output: (B, 1 + H*W, C).
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 pos_grid: Sequence[int],
                 kernel_size: int = 5,
                 alpha: float = 4.0,
                 qkv_bias: bool = True,
                 proj_drop: float = 0.):
        super().__init__(
            embed_dims,
            num_heads,
            pos_grid,
            kernel_size=kernel_size,
            alpha=alpha,
            qkv_bias=qkv_bias,
            family='swin',
            proj_drop=proj_drop)

    #: keys first among those of :meth:`project_attended` that lie on no grid cell: the
    #: class token's
    off_grid_keys = 1

    def project_attended(self,
                         x: Tensor,
                         hw_shape: Sequence[int],
                         pos_encoding: Optional[Tensor] = None) -> AttentionInputs:
        """The inputs of the patch queries' linear attention for the tokens ``x``
        (B, 1 + H*W, C), the class token first, with every key they attend to (the
        attention analysis reads them): as :meth:`PolaLinearAttention.project` of the
        patches, the class token's key (without ``P``, divided by ``softplus(scale)`` as
        the op divides every key) first among the keys."""
        (q, k, v, g, eps, key_hw), scale = self._project(
            x[:, 1:], hw_shape, pos_encoding=pos_encoding, divide=True)
        k_cls = linear_parts(self.qkvg, x[:, :1], 4)[1]
        k_cls = split_heads(k_cls, self.num_heads, self.head_dims) / scale
        return AttentionInputs(q, torch.cat([k_cls, k], dim=2), v, g, eps, key_hw)

    def forward(self,
                x: Tensor,
                hw_shape: Sequence[int],
                pos_encoding: Optional[Tensor] = None) -> Tensor:
        """Attend (see the class docstring); ``pos_encoding``: ``P`` already on the
        patch grid (1, H*W, C), or None to resize it here. An export inside
        :func:`~polaformer_mm.utils.graph_forms.graph_forms` records
        :meth:`forward_channels_first` instead, the same result."""
        self._check_tokens(x, hw_shape)
        (q, k, v, g, eps, _), scale = self._project(
            x[:, 1:], hw_shape, pos_encoding=pos_encoding, divide=False)
        h, d = self.num_heads, self.head_dims
        q_cls, k_cls, v_cls, g_cls = linear_parts(self.qkvg, x[:, :1], 4)
        q_cls, k_cls, v_cls = (split_heads(t, h, d) for t in (q_cls, k_cls, v_cls))
        keys, values = torch.cat([k_cls, k], dim=2), torch.cat([v_cls, v], dim=2)
        out = pola_linear_attention(q, keys, values, self.power, self.alpha, eps, scale=scale)
        out = merge_heads(out, h) + self.local_term(v, hw_shape)
        out_cls = softmax_attention(q_cls, keys, values, d, 0., False)
        out_cls = merge_heads(out_cls, h)
        out = torch.cat([out_cls * g_cls, out * g], dim=1)
        return self.proj_drop(self.proj(out))

    def _check_tokens(self, x: Tensor, hw_shape: Sequence[int]) -> None:
        """A clear error unless ``x`` is (B, 1 + H*W, C) for ``hw_shape``."""
        H, W = hw_shape

        def error() -> Optional[str]:
            if x.dim() == 3 and tuple(x.shape[1:]) == (H * W + 1, self.embed_dims):
                return None
            return (f'PolaViTAttention expects (B, 1 + {H}*{W}, {self.embed_dims}) tokens '
                    f'(the class token first) for hw_shape {tuple(hw_shape)}; got '
                    f'{tuple(x.shape)}')

        check_sizes(error)

    def forward_channels_first(self,
                               x: Tensor,
                               hw_shape: Sequence[int],
                               pos_encoding: Optional[Tensor] = None) -> Tensor:
        """:meth:`forward` (same arguments, same result up to rounding) in the
        channels-first form an ONNX export records, that of
        :meth:`PolaLinearAttention.forward_channels_first
        <polaformer_mm.models.attention.PolaLinearAttention.forward_channels_first>`:
        all 1 + H*W tokens projected at once as ``W x^T`` (B, C, 1 + H*W), queries
        and keys divided by ``softplus(scale)`` in the weights, ``P`` added to the
        patch keys alone. The class query's softmax takes the same divided keys, its
        own query multiplied by ``softplus(scale)^2`` (so that each channel's product
        is that of the undivided query and key)."""
        self._check_tokens(x, hw_shape)
        B, L, C = x.shape
        H, W = hw_shape
        h, d = self.num_heads, self.head_dims
        scale = F.softplus(self.scale).view(C, 1)
        tokens = with_ones(x)
        q = channels_first_projection(self._rows('q', scale), tokens)
        k = channels_first_projection(self._rows('k', scale), tokens)
        v = channels_first_projection(self._rows('v', None), tokens)
        g = channels_first_projection(self._rows('g', None), tokens)
        # no P on the class key
        k = k + F.pad(self.key_shift_channels_first(pos_encoding, (H, W), scale), (1, 0))
        keys, values = k.view(B, h, d, L), v.view(B, h, d, L)
        out = pola_linear_attention_channels_first(q[:, :, 1:].reshape(B, h, d, H * W), keys,
                                                   values, self.power, self.alpha, 1e-6)
        out = out.reshape(B, C, H * W) + self._local_term_channels_first(v[:, :, 1:], hw_shape)
        q_cls = (q[:, :, :1] * (scale * scale)).reshape(B, h, 1, d)
        weights = torch.softmax(torch.matmul(q_cls, keys) * d**-0.5, dim=-1)  # (B, h, 1, L)
        out_cls = torch.matmul(values, weights.transpose(-2, -1)).reshape(B, C, 1)
        return self._output_tokens(torch.cat([out_cls, out], dim=2) * g)


register_graph_form(PolaViTAttention, PolaViTAttention.forward_channels_first)


class ViTBlock(TransformerEncoderLayer):
    """An 'S' block: mmpretrain's ``TransformerEncoderLayer`` as it builds itself (``ln1``,
    its ``MultiheadAttention`` as ``attn``, ``ln2``, ``ffn``), called with the arguments of
    the 'L' blocks (:class:`PolaViTBlock`), which it does not need.

    Args:
        **kwargs: ``TransformerEncoderLayer``'s arguments (``embed_dims``,
            ``num_heads``, ``feedforward_channels``, ``drop_rate``,
            ``attn_drop_rate``, ``drop_path_rate``, ``qkv_bias``, ``norm_cfg``).

    Inputs: tokens (B, 1 + H*W, C), and the grid (H, W) and a positional encoding that
    it takes no notice of. Output: tokens (B, 1 + H*W, C). An export inside
    :func:`~polaformer_mm.utils.graph_forms.graph_forms` records
    :func:`vit_block_graph_form`, the same maths in the operators of ONNX opset 11.
    """
    attn_type = 'S'

    def forward(self,
                x: Tensor,
                hw_shape: Optional[Sequence[int]] = None,
                pos_encoding: Optional[Tensor] = None) -> Tensor:
        """mmpretrain's forward of the tokens ``x``."""
        return super().forward(x)


@register_graph_form(ViTBlock)
def vit_block_graph_form(block: ViTBlock,
                         x: Tensor,
                         hw_shape: Optional[Sequence[int]] = None,
                         pos_encoding: Optional[Tensor] = None) -> Tensor:
    """The graph form of an 'S' block (:mod:`polaformer_mm.utils.graph_forms`): the
    block's own modules, its attention product by
    :func:`~polaformer_mm.models.utils.softmax_attention` (which a graph records in
    operators of every ONNX opset, where ``F.scaled_dot_product_attention``, which
    mmpretrain's ``MultiheadAttention`` calls, exports from opset 14 only)."""
    attn = block.attn
    tokens = block.ln1(x)
    B, N, _ = tokens.shape
    qkv = attn.qkv(tokens).reshape(B, N, 3, attn.num_heads, attn.head_dims).permute(2, 0, 3, 1, 4)
    out = softmax_attention(qkv[0], qkv[1], qkv[2], attn.head_dims,
                            attn.attn_drop if attn.training else 0., attn.training)
    out = attn.proj(out.transpose(1, 2).reshape(B, N, attn.embed_dims))
    out = attn.out_drop(attn.gamma1(attn.proj_drop(out)))
    if attn.v_shortcut:
        out = qkv[2].squeeze(1) + out
    x = x + out
    return block.ffn(block.ln2(x), identity=x)


class PolaViTBlock(BaseModule):
    """An 'L' block: mmpretrain's ``TransformerEncoderLayer`` with
    :class:`PolaViTAttention` in place of its attention, built of the same upstream parts
    (mmpretrain's norm ``ln1`` / ``ln2``, mmcv's ``FFN`` as mmpretrain configures it) and
    the same state-dict keys, with stochastic depth on the attention branch.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads.
        feedforward_channels (int): Hidden channels of the FFN.
        pos_grid (Sequence[int]): The patch grid of the positional encoding ``P``.
        alpha (float): Pola exponent ``1 + alpha * sigmoid(power)``.
        kernel_size (int): Pola depthwise-conv kernel (odd).
        drop_rate (float): Dropout after the projections. Default: 0.
        drop_path_rate (float): Stochastic depth of both branches. Default: 0.
        qkv_bias (bool): Bias of the ``qkvg`` projection. Default: True.
        norm_cfg (dict): Norms. Default: ``dict(type='LN')``.

    Inputs: tokens (B, 1 + H*W, C), the grid (H, W), and optionally ``P`` resized to that
    grid. Output: tokens (B, 1 + H*W, C).
    """
    attn_type = 'L'

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 feedforward_channels: int,
                 pos_grid: Sequence[int],
                 alpha: float,
                 kernel_size: int,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 qkv_bias: bool = True,
                 norm_cfg: dict = dict(type='LN')):
        super().__init__()
        self.ln1 = build_norm_layer(norm_cfg, embed_dims)
        self.attn = PolaViTAttention(
            embed_dims,
            num_heads,
            pos_grid,
            kernel_size=kernel_size,
            alpha=alpha,
            qkv_bias=qkv_bias,
            proj_drop=drop_rate)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.ln2 = build_norm_layer(norm_cfg, embed_dims)
        self.ffn = FFN(
            embed_dims=embed_dims,
            feedforward_channels=feedforward_channels,
            num_fcs=2,
            ffn_drop=drop_rate,
            dropout_layer=dict(type='DropPath', drop_prob=drop_path_rate),
            act_cfg=dict(type='GELU'))

    def forward(self,
                x: Tensor,
                hw_shape: Sequence[int],
                pos_encoding: Optional[Tensor] = None) -> Tensor:
        """The block on the tokens ``x`` (see the class docstring)."""
        x = x + self.drop_path(self.attn(self.ln1(x), hw_shape, pos_encoding))
        return self.ffn(self.ln2(x), identity=x)


@MODELS.register_module(force=True)  # noted in backbones/__init__, imported on first look-up
class PolaViT(PolaBackboneBase):
    """Pola-DeiT backbone: mmpretrain's ``VisionTransformer`` (DeiT sizes) with
    polarity-aware linear attention, for dense prediction at any input size.

    Its modules and state-dict keys are those of mmpretrain's ViT (``cls_token``,
    ``pos_embed``, ``patch_embed.projection.*``, ``layers.{j}.ln1 / attn / ln2 /
    ffn.*``, the final norm ``ln1.*``); only the module at ``layers.{j}.attn`` depends
    on the block's attention. With every block 'S' it is mmpretrain's DeiT: it loads
    its state dicts and gives its feature maps.

    The class token in an 'L' block (:class:`PolaViTAttention`): the patch queries
    attend by the Pola op to all tokens, the class token included (one more key and
    value, without positional encoding); the class query attends by softmax to the
    same keys and values. Why: the Pola op serves the many patch queries at linear
    cost, and the class token's key and value keep the path by which the global
    summary reaches every patch, as in DeiT; the single class query is DeiT's readout
    for classification, and its exact softmax costs O(H*W), no more than the op, so
    nothing is approximated where exactness is free (with a zero positional encoding,
    as a fresh model has, it is the softmax of DeiT's own query and keys). The local
    term (the depthwise conv of the values) exists on the patch grid only.

    Args:
        arch (str | dict): 'deit-tiny', 'deit-small', 'deit-base' (or 'deit-t',
            'deit-s', 'deit-b', and 't', 's', 'b'; mmpretrain's DeiT sizes), or a dict
            with mmpretrain's ``embed_dims``, ``num_layers``, ``num_heads`` and
            ``feedforward_channels``. Default: 'deit-small'.
        img_size (int | tuple, optional): Sized the position embedding and the Pola
            positional encodings in former versions; sizes nothing now (the model runs
            at any input size): a value other than ``pretrain_img_size`` is warned about.
            Default: None.
        pretrain_img_size (int | tuple): Input size the position embedding and the
            Pola positional encodings ``P`` are learned at: they lie on its patch grid
            (14x14 for 224), whatever the input size, and are resized (bicubic, or
            ``interpolate_mode`` for the position embedding) to the input's grid at run
            time, so that the parameters do not depend on the input size. Default: 224.
        patch_size (int): Patch size. Default: 16.
        in_channels (int): Image channels. Default: 3.
        out_indices (int | Sequence[int]): Blocks whose outputs are returned, as
            (B, C, ceil(H / 16), ceil(W / 16)) maps of the patch tokens; negative
            indices count from the end (mmpretrain / mmseg). Default: -1 (the last).
        attn_types (str | Sequence[str]): 'L' (Pola) or 'S' (softmax), one letter for
            all blocks or one per block. Default: 'L'.
        alpha (float): Pola exponent ``1 + alpha * sigmoid(power)``. Default: 4.0.
        kernel_size (int): Kernel of the Pola depthwise conv (odd). Default: 5.
        qkv_bias (bool): Bias of the attention projections. Default: True.
        drop_rate (float): Dropout after the position embedding and the
            projections. Default: 0.
        attn_drop_rate (float): Dropout on the softmax weights of 'S' blocks.
            Default: 0.
        drop_path_rate (float): Stochastic depth, rising linearly over the blocks to
            this value. Default: 0.
        norm_cfg (dict): Norms. Default: ``dict(type='LN', eps=1e-6)``.
        final_norm (bool): Normalise the output of the last block (``ln1``).
            Default: True (mmpretrain's default; mmseg's ViT defaults to False).
        output_cls_token (bool): Return ``[map, class token (B, C)]`` per index
            (mmseg's meaning). Default: False.
        interpolate_mode (str): Resizing of the position embedding: 'bicubic' or
            'bilinear'. Default: 'bicubic'.
        frozen_stages (int): mmpretrain's meaning: k >= 1 freezes the patch and
            position embeddings, the class token and blocks 0..k-1 (and the final
            norm when k is the number of blocks); 0 and -1 freeze nothing.
            Default: -1.
        norm_eval (bool): Keep BatchNorm layers (if any) in eval mode. Default: False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        pretrained (str, optional): Deprecated, as in mmseg; the same as
            ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)``.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=...,
            prefix=...)`` loads weights strictly (a position embedding or positional
            encoding learned on another grid is resized to the grid of
            ``pretrain_img_size``, which is logged with the keys and both grids; a model
            whose grid is not square writes it into its state dict as ``pos_grid``, a file
            without one has a square grid); None uses DeiT's initialisation.
            Default: None.

    Input: images (B, in_channels, H, W), any H and W. Output: a tuple with one map (or
    ``[map, class token]``) per ``out_indices`` entry.
    """

    family = 'vit'
    arch_zoo: Dict[str, dict] = {
        **{
            k: v
            for k, v in VisionTransformer.arch_zoo.items() if k.startswith('deit-')
        },
        **{
            k: VisionTransformer.arch_zoo[f'deit-{k}']
            for k in 'tsb'
        },
    }
    _arch_keys = ('embed_dims', 'num_layers', 'num_heads', 'feedforward_channels')

    def __init__(self,
                 arch: Union[str, dict] = 'deit-small',
                 img_size: Union[int, Sequence[int], None] = None,
                 pretrain_img_size: Union[int, Sequence[int]] = 224,
                 patch_size: int = 16,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = -1,
                 attn_types: Union[str, Sequence[str]] = 'L',
                 alpha: float = 4.0,
                 kernel_size: int = 5,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 final_norm: bool = True,
                 output_cls_token: bool = False,
                 interpolate_mode: str = 'bicubic',
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 pretrained: Optional[str] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg, pretrained=pretrained)
        self.arch = self._parse_vit_arch(arch)
        num_layers, embed_dims = self.arch['num_layers'], self.arch['embed_dims']
        self._setup_stages(num_layers, self._block_attn_types(attn_types, num_layers),
                           self._block_indices(out_indices, num_layers), frozen_stages, norm_eval,
                           with_cp)
        self._check_vit_args(
            pretrain_img_size, img_size, patch_size, in_channels, interpolate_mode,
            dict(drop_rate=drop_rate, attn_drop_rate=attn_drop_rate, drop_path_rate=drop_path_rate))
        self.interpolate_mode = interpolate_mode
        self.pretrain_img_size = to_2tuple(pretrain_img_size)
        self.final_norm = bool(final_norm)
        self.output_cls_token = bool(output_cls_token)
        self.num_features = [embed_dims] * num_layers

        self.patch_embed = ViTPatchEmbed(
            in_channels=in_channels,
            input_size=to_2tuple(pretrain_img_size),
            embed_dims=embed_dims,
            conv_type='Conv2d',
            kernel_size=patch_size,
            stride=patch_size)
        # the grid of the position embedding and of every P: that of pretrain_img_size,
        # whatever the input size (resized to the input's grid at run time)
        self.patch_resolution = tuple(self.patch_embed.init_out_size)
        if img_size is not None:
            self._warn_img_size(to_2tuple(img_size), to_2tuple(pretrain_img_size), patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.pos_embed = nn.Parameter(
            torch.zeros(1, 1 + math.prod(self.patch_resolution), embed_dims))
        self.drop_after_pos = nn.Dropout(p=drop_rate)
        dpr = drop_path_rates(drop_path_rate, [num_layers])[0]
        block_args = dict(
            embed_dims=embed_dims,
            num_heads=self.arch['num_heads'],
            feedforward_channels=self.arch['feedforward_channels'],
            drop_rate=drop_rate,
            qkv_bias=qkv_bias,
            norm_cfg=norm_cfg)
        self.layers = nn.ModuleList(
            PolaViTBlock(
                pos_grid=self.patch_resolution,
                alpha=alpha,
                kernel_size=kernel_size,
                drop_path_rate=dpr[j],
                **block_args) if self.attn_types[j] ==
            'L' else ViTBlock(attn_drop_rate=attn_drop_rate, drop_path_rate=dpr[j], **block_args)
            for j in range(num_layers))
        if self.final_norm:
            self.ln1 = build_norm_layer(norm_cfg, embed_dims)
        self._pos_encodings = StagePositionalEncodings()
        # a file learned at another size loads with its grids resized, as in mmpretrain;
        # a grid that is not square is written into the state dict (GRID_KEY)
        self._register_load_state_dict_pre_hook(self._fit_grids_hook)
        self._register_state_dict_hook(_write_grid)
        self._freeze_stages()  # before any optimizer sees the parameters

    def _parse_vit_arch(self, arch: Union[str, dict]) -> dict:
        if isinstance(arch, str):
            if arch.lower() not in self.arch_zoo:
                raise KeyError(f'Unknown PolaViT arch {arch!r}; choose from '
                               f'{sorted(self.arch_zoo)} or pass a dict')
            return dict(self.arch_zoo[arch.lower()])
        if not isinstance(arch, dict):
            raise TypeError(f'PolaViT arch must be a str or dict, got {type(arch)}')
        missing = [k for k in self._arch_keys if k not in arch]
        if missing:
            raise KeyError(f'PolaViT arch dict misses keys {missing} '
                           f'(needs {list(self._arch_keys)})')
        arch = {k: arch[k] for k in self._arch_keys}
        for key, value in arch.items():
            check_positive_int(f'arch {key}', value)
        if arch['embed_dims'] % arch['num_heads']:
            raise ValueError(f"arch embed_dims {arch['embed_dims']} is not divisible by "
                             f"num_heads {arch['num_heads']}")
        return arch

    @staticmethod
    def _block_attn_types(attn_types, num_layers: int) -> str:
        """One letter per block; a named error otherwise."""
        letters = attn_types
        if isinstance(attn_types, (list, tuple)):
            letters = ''.join(a if isinstance(a, str) and len(a) == 1 else '?' for a in attn_types)
        if not isinstance(letters, str) or len(letters) not in (
                1, num_layers) or set(letters.upper()) - set('LS'):
            raise ValueError(f"attn_types must be one letter 'L'/'S' for all {num_layers} "
                             f'blocks or one per block, got {attn_types!r}')
        return letters.upper() * (num_layers if len(letters) == 1 else 1)

    @staticmethod
    def _block_indices(out_indices, num_layers: int):
        """Negative indices counted from the end, as mmpretrain and mmseg count them; a
        named error for indices beyond the blocks (types are checked by
        :meth:`_setup_stages`)."""
        one = is_int(out_indices)
        indices = [out_indices] if one else out_indices
        if not isinstance(indices, (list, tuple)):
            return out_indices
        bad = [i for i in indices if is_int(i) and not -num_layers <= i < num_layers]
        if bad:
            raise ValueError(f'out_indices must name blocks in 0..{num_layers - 1} (or '
                             f'-{num_layers}..-1 from the end), got {out_indices}')
        return [i + num_layers if is_int(i) and i < 0 else i for i in indices]

    @staticmethod
    def _check_vit_args(pretrain_img_size, img_size, patch_size, in_channels, interpolate_mode,
                        drop_rates: Dict[str, float]) -> None:
        for s in to_2tuple(pretrain_img_size):
            check_positive_int('pretrain_img_size', s)
        for s in () if img_size is None else to_2tuple(img_size):
            check_positive_int('img_size', s)
        check_positive_int('patch_size', patch_size)
        check_positive_int('in_channels', in_channels)
        if interpolate_mode not in INTERPOLATE_MODES:
            raise ValueError(f'interpolate_mode must be one of {INTERPOLATE_MODES}, got '
                             f'{interpolate_mode!r}')
        for name, rate in drop_rates.items():
            check_probability(name, rate)

    @staticmethod
    def _warn_img_size(img_size: Tuple[int, int], pretrain_img_size: Tuple[int, int],
                       patch_size: int) -> None:
        """A warning where ``img_size`` would once have set other grids than
        ``pretrain_img_size`` sets now."""
        if img_size == pretrain_img_size:
            return
        old = 'x'.join(str(math.ceil(s / patch_size)) for s in img_size)
        new = 'x'.join(str(math.ceil(s / patch_size)) for s in pretrain_img_size)
        warnings.warn(
            f'PolaViT: img_size={img_size} no longer sizes the position embedding or the '
            f'positional encodings P: they are learned on the {new} patch grid of '
            f'pretrain_img_size={pretrain_img_size} and resized to the input\'s grid at run '
            f'time. Set pretrain_img_size={img_size} for the {old} grid of the former layout '
            '(a file learned on it then loads as it is), or leave img_size out.',
            UserWarning,
            stacklevel=3)

    def forward(self, x: Tensor) -> Tuple[Union[Tensor, List[Tensor]], ...]:
        """Images (B, C, H, W) -> the outputs of the ``out_indices`` blocks (see the
        class docstring)."""
        self._check_images(x)
        patches, hw_shape = self.patch_embed(x)
        pos = self.pos_embed
        patches = patches + resize_token_grid(pos[:, 1:], self.patch_resolution, hw_shape,
                                              self.interpolate_mode)
        cls_token = (self.cls_token + pos[:, :1]).expand(x.shape[0], -1, -1)
        x = self.drop_after_pos(torch.cat([cls_token, patches], dim=1))
        encodings = self._pos_encodings([block.attn for block in self.layers], hw_shape)
        outs, last = [], max(self.out_indices)
        for i, block in enumerate(self.layers[:last + 1]):
            x = run_blocks([block], x, hw_shape, self.with_cp, [encodings[i]])
            if i == len(self.layers) - 1 and self.final_norm:
                x = self.ln1(x)
            if i in self.out_indices:
                # contiguous maps, as PolaBackboneBase.forward returns them
                out = nlc_to_nchw(x[:, 1:], hw_shape).contiguous()
                outs.append([out, x[:, 0]] if self.output_cls_token else out)
        return tuple(outs)

    def _frozen_modules(self):
        if self.frozen_stages < 1:
            return
        yield self.patch_embed
        yield self.drop_after_pos
        yield from self.layers[:self.frozen_stages]
        if self.frozen_stages == len(self.layers) and self.final_norm:
            yield self.ln1

    def _freeze_stages(self) -> None:
        super()._freeze_stages()
        if self.frozen_stages >= 1:
            self.cls_token.requires_grad = False
            self.pos_embed.requires_grad = False

    def _official_init(self) -> None:
        """DeiT's initialisation: trunc-normal(0.02) linears, position embedding and
        class token, unit LayerNorms; the Pola-specific parameters start at zero."""
        super()._official_init()
        trunc_normal_(self.cls_token, std=.02)

    def _optional_key(self, key: str) -> bool:
        """Without ``final_norm``, a file's final norm (``ln1.*``) is left unused, as
        mmseg's ViT leaves it; the grid record (:data:`GRID_KEY`) is written for grids
        that are not square only."""
        return (not self.final_norm and key.startswith('ln1.')) or key in self.optional_state_keys

    #: keys a checkpoint of this module may lack or carry beyond its ``state_dict()``
    #: (read by :func:`polaformer_mm.engine.checkpoint_fit.find_mismatch`)
    optional_state_keys = (GRID_KEY, )

    def _load_pretrained(self, state_dict, source) -> None:
        super()._load_pretrained(self._fit_grids(dict(state_dict)), source)

    def _fit_grids_hook(self, state_dict, prefix, *args, **kwargs) -> None:
        fitted = self._fit_grids({
            k[len(prefix):]: v
            for k, v in state_dict.items() if k.startswith(prefix)
        })
        state_dict.pop(prefix + GRID_KEY, None)  # read: no tensor of the model takes it
        state_dict.update({prefix + k: v for k, v in fitted.items()})

    def _fit_grids(self, state_dict: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """Resize a ``pos_embed`` and 'L' ``positional_encoding`` learned on another grid
        to this model's, that of ``pretrain_img_size`` (``interpolate_mode`` / bicubic, as
        at run time), and log what was resized: the keys and both grids, as a warning
        where a file's grid is larger than the model's (a file of the former layout, whose
        grid followed ``img_size``; ``pretrain_img_size`` set to the file's size loads it
        as it is). The file's grid is its :data:`GRID_KEY` entry (written by models whose
        grid is not square; taken out of the returned dict); a file without one has a
        square grid (DeiT and mmpretrain files, and those of square models), so tables of
        another number of tokens than a square are left as they are (a shape mismatch is
        then named by the loader)."""
        recorded = state_dict.pop(GRID_KEY, None)
        file_grid = _read_grid(recorded) if recorded is not None else None
        targets = {'pos_embed': (self.pos_embed, 1, self.interpolate_mode)}
        for j, block in enumerate(self.layers):
            if isinstance(block.attn, PolaLinearAttention):
                targets[f'layers.{j}.attn.positional_encoding'] = (block.attn.positional_encoding,
                                                                   0, 'bicubic')
        resized: Dict[Tuple[int, int], List[str]] = {}
        for key, (own, extra, mode) in targets.items():
            value = state_dict.get(key)
            if value is None or value.dim() != 3 or value.shape[2] != own.shape[2]:
                continue
            tokens = value.shape[1] - extra
            if file_grid is not None:
                grid = file_grid
                if grid[0] * grid[1] != tokens:
                    raise ValueError(f'{GRID_KEY}={list(grid)} of the file does not fit its {key} '
                                     f'{tuple(value.shape)} ({tokens} tokens on the grid, '
                                     f'{grid[0] * grid[1]} expected)')
            else:
                side = math.isqrt(max(tokens, 0))
                if side < 1 or side * side != tokens:
                    continue
                grid = (side, side)
            if grid == tuple(self.patch_resolution):
                continue
            with torch.no_grad():
                resized_grid = resize_token_grid(value[:, extra:].float(), grid,
                                                 self.patch_resolution, mode).to(value.dtype)
                state_dict[key] = torch.cat([value[:, :extra], resized_grid], dim=1)
            resized.setdefault(grid, []).append(key)
        H, W = self.patch_resolution
        patch = self.patch_embed.projection.stride[0]
        size = 'x'.join(map(str, self.pretrain_img_size))
        for (gh, gw), keys in resized.items():
            larger = gh * gw > H * W
            MMLogger.get_current_instance().log(
                logging.WARNING if larger else logging.INFO,
                f'PolaViT: resized {_key_list(keys)} from the file\'s {gh}x{gw} grid to '
                f'this model\'s {H}x{W} (pretrain_img_size {size}, patch {patch})' +
                (f'; the file holds more positions than the model keeps: '
                 f'build it with pretrain_img_size={_size_arg(gh * patch, gw * patch)} to load '
                 'them as they are' if larger else '') +
                ('; the file names no grid: its tables were read as square'
                 if file_grid is None and H != W else ''))
        return state_dict


def _write_grid(module: 'PolaViT', state_dict, prefix: str, local_metadata) -> None:
    """State-dict hook: the grid record of a model whose grid is not square."""
    H, W = module.patch_resolution
    if H != W:
        state_dict[prefix + GRID_KEY] = torch.tensor([H, W], dtype=torch.int64)


def _read_grid(value) -> Tuple[int, int]:
    """The (H, W) of a :data:`GRID_KEY` entry; a ValueError naming what it holds otherwise."""
    grid = value.tolist() if hasattr(value, 'tolist') else value
    if (not isinstance(grid, (list, tuple)) or len(grid) != 2
            or not all(is_int(g) and g >= 1 for g in grid)):
        raise ValueError(f'the file\'s {GRID_KEY} is {grid!r}: expected the patch grid '
                         '[H, W] of its position tables (two positive ints)')
    return int(grid[0]), int(grid[1])


def _size_arg(h: int, w: int):
    """A ``pretrain_img_size`` argument as a config writes it."""
    return h if h == w else (h, w)


def _key_list(keys: Sequence[str]) -> str:
    """Keys for a message: the block keys of one name as ``layers.{0,1,2}.rest``."""
    blocks: Dict[str, List[str]] = {}
    plain = []
    for key in keys:
        parts = key.split('.', 2)
        if len(parts) == 3 and parts[0] == 'layers' and parts[1].isdigit():
            blocks.setdefault(parts[2], []).append(parts[1])
        else:
            plain.append(key)
    plain += [
        f'layers.{{{",".join(j)}}}.{rest}' if len(j) > 1 else f'layers.{j[0]}.{rest}'
        for rest, j in blocks.items()
    ]
    return ', '.join(plain)


# ------------------------------------------------------------------ the DeiT / ViT family
_DEIT_BLOCK = [('norm1.', 'ln1.'), ('norm2.', 'ln2.'), ('attn.', 'attn.'),
               ('mlp.fc1.', 'ffn.layers.0.0.'), ('mlp.fc2.', 'ffn.layers.1.')]


def _drop_distillation(out: Builder, state_dict: Dict[str, Tensor], key: str) -> None:
    """A distilled DeiT's ``dist_token`` and its row (1) of the position embedding."""
    value = state_dict[key]
    if 'dist_token' in state_dict:
        out.put('pos_embed', torch.cat([value[:, :1], value[:, 2:]], dim=1), key,
                'distillation-token row dropped')
    else:
        out.put('pos_embed', value, key)


def _vit_mm(state_dict: Dict[str, Tensor]) -> Converted:
    """mmpretrain's VisionTransformer keys (the twin's); a distilled DeiT's
    distillation token is dropped."""
    out = Builder()
    for key, value in state_dict.items():
        if key == 'dist_token':
            out.drop(key, 'distillation token')
        elif key == 'pos_embed':
            _drop_distillation(out, state_dict, key)
        else:
            out.put(key, value, key)
    return out.result()


def _vit_official(state_dict: Dict[str, Tensor]) -> Converted:
    """The official DeiT / timm ViT keys: ``cls_token``, ``pos_embed``,
    ``patch_embed.proj``, ``blocks.{j}`` (``norm1``, ``attn.qkv``, ``attn.proj``,
    ``norm2``, ``mlp.fc1``, ``mlp.fc2``), ``norm``, ``head`` (and ``dist_token`` /
    ``head_dist`` of the distilled models) -> mmpretrain's VisionTransformer keys."""
    out = Builder()
    for key, value in state_dict.items():
        block = re.match(r'^blocks\.(\d+)\.(.+)$', key)
        if key.startswith(('head.', 'head_dist.')):
            out.drop(key, 'classifier head')
        elif key == 'dist_token':
            out.drop(key, 'distillation token')
        elif key == 'pos_embed':
            _drop_distillation(out, state_dict, key)
        elif key.startswith('patch_embed.proj.'):
            out.put(key.replace('.proj.', '.projection.', 1), value, key)
        elif key.startswith('norm.'):
            out.put('ln1.' + key[len('norm.'):], value, key)
        elif block:
            rest = block[2]
            for old, new in _DEIT_BLOCK:
                if rest.startswith(old):
                    rest = new + rest[len(old):]
                    break
            out.put(f'layers.{block[1]}.{rest}', value, key)
        else:
            out.put(key, value, key)
    return out.result()


def _deit_benchmark() -> Dict[str, dict]:
    """Pola-DeiT-S/B beside the DeiT of the UperNet baselines (mmseg's
    ``VisionTransformer``), both as the configs build them (the Pola one's grids at 224,
    resized at run time; the baseline's position table at 512), the four 1/16 maps of
    blocks 2/5/8/11, no final norm."""
    named = {}
    for k, arch in (('s', 'deit-small'), ('b', 'deit-base')):
        config = f'configs/pola_vit/upernet_{{}}deit-{k}16_8xb2-80k_ade20k-512x512.py'
        common = dict(out_indices=(2, 5, 8, 11), drop_path_rate=0.1)
        named[f'pola-deit-{k}'] = dict(
            scope=None,
            cfg=dict(
                type='PolaViT',
                arch=arch,
                pretrain_img_size=224,
                attn_types='L',
                final_norm=False,
                **common),
            config=config.format('pola-'))
        sizes = PolaViT.arch_zoo[arch]
        named[f'deit-{k}'] = dict(
            scope='mmseg',
            cfg=dict(
                type='VisionTransformer',
                img_size=(512, 512),
                embed_dims=sizes['embed_dims'],
                num_layers=sizes['num_layers'],
                num_heads=sizes['num_heads'],
                **common),
            config=config.format(''))
    return named


_VIT_OFFICIAL = (r'^cls_token$', r'^patch_embed\.proj\.weight$',
                 r'^blocks\.\d+\.attn\.qkv\.weight$')
_VIT_MM = (r'^cls_token$', r'^patch_embed\.projection\.weight$',
           r'^layers\.\d+\.attn\.qkv\.weight$')
_DEIT_UPERNET = 'upernet_pola-deit-{{}}16{}_8xb2-{}_ade20k-512x512.py'  # neck, schedule

#: the DeiT / ViT family (:mod:`polaformer_mm.models.family`)
FAMILY = register_family(
    BackboneFamily(
        name='vit',
        title='DeiT / ViT',
        backbone=PolaViT,
        layouts=(
            Layout('vit', "mmpretrain's VisionTransformer (PolaViT's own keys)",
                   lambda k: matches(k, *_VIT_MM), _vit_mm),
            Layout('vit', 'the official DeiT / timm ViT release',
                   lambda k: matches(k, *_VIT_OFFICIAL), _vit_official),
        ),
        config_name='deit',
        config_title='DeiT',
        config_sizes='[tsb]',
        config_size_suffix='16',
        benchmark=_deit_benchmark,
        reproduce={
            'upernet': config_set('pola_vit', _DEIT_UPERNET.format('', '160k'), 'sb', 'deit'),
            'upernet-80k': config_set('pola_vit', _DEIT_UPERNET.format('', '80k'), 'sb', 'deit'),
            'upernet-mln': config_set('pola_vit', _DEIT_UPERNET.format('_mln', '160k'), 'sb',
                                      'deit'),
        },
        attention_names=r'(?:^|\.)layers\.(?P<block>\d+)\.attn$'))
