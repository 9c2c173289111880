"""Attention modules: polarity-aware linear attention and the softmax baselines
used by 'S' stages (PVT spatial-reduction attention, Swin window attention).

The computation of :class:`PolaLinearAttention` is written up in
``docs/advanced_guides/method.md``.
"""
from functools import partial
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS
from torch import Tensor

from ..ops import pola_linear_attention
from ..ops.pola_attention.channels_first import pola_linear_attention_channels_first
from ..ops.pola_attention.checks import check_alpha
from ..utils.graph_forms import register_graph_form
from .utils import (check_sizes, conv_token_map, depthwise_conv, nchw_to_nlc, nlc_to_nchw,
                    pad_for_patches, resize_channels_first, resize_token_grid, softmax_attention,
                    token_rows)

FAMILIES = ('pvt', 'swin')


class AttentionInputs(NamedTuple):
    """What :meth:`PolaLinearAttention.project` returns."""
    q: Tensor  #: queries (B, h, N, d), divided by softplus(scale)
    k: Tensor  #: keys (B, h, n, d), P added, divided by softplus(scale)
    v: Tensor  #: values (B, h, n, d)
    g: Tensor  #: gate (B, N, C)
    eps: Union[float, Tensor]  #: the op's eps, per batch entry with padding
    key_hw: Tuple[int, int]  #: the key grid (h_k, w_k)


def head_dims(embed_dims: int, num_heads: int) -> int:
    """The head width C / h; a named error when C is not divisible by h."""
    if num_heads < 1 or embed_dims % num_heads:
        raise ValueError(f'embed_dims {embed_dims} is not divisible by '
                         f'num_heads {num_heads}')
    return embed_dims // num_heads


class SpatialReduction(nn.Module):
    """Conv (kernel = stride = ``ratio``) + LayerNorm: the reduced key/value tokens
    of PVT attention.

    Maps whose sides are not multiples of the ratio are zero-padded (ceil), so the
    key grid is never empty.

    Args:
        embed_dims (int): Channels C.
        ratio (int): Reduction r >= 2.

    Input: tokens (B, H*W, C) and (H, W). Output: tokens (B, h*w, C) and
    (h, w) = (ceil(H / r), ceil(W / r)).
    """

    def __init__(self, embed_dims: int, ratio: int):
        super().__init__()
        self.ratio = ratio
        self.sr = nn.Conv2d(embed_dims, embed_dims, kernel_size=ratio, stride=ratio)
        self.norm = nn.LayerNorm(embed_dims)

    def forward(self, x: Tensor, hw_shape: Sequence[int]) -> Tuple[Tensor, Tuple[int, int]]:
        """Reduced tokens and their grid (see the class docstring)."""
        x = conv_token_map(self.sr, pad_for_patches(nlc_to_nchw(x, hw_shape), self.ratio))
        kv_hw = (x.shape[2], x.shape[3])
        return self.norm(nchw_to_nlc(x)), kv_hw


def split_heads(x: Tensor, num_heads: int, head_dims: int) -> Tensor:
    """Tokens (B, N, h*d) -> heads (B, h, N, d), a view where the layout allows (a
    reshape whose sizes the graph takes from ``x`` under a trace: an ONNX Reshape of
    every opset, where ``unflatten`` needs opset 13). One head is an ``unsqueeze``: the
    same view, which a graph records without the ``Transpose`` (a copy of the whole
    tensor in graph runtimes) that moving a size-1 axis would be."""
    if num_heads == 1:
        return x.unsqueeze(1)
    return x.reshape(x.shape[0], x.shape[1], num_heads, head_dims).transpose(1, 2)


def merge_heads(x: Tensor, num_heads: int) -> Tensor:
    """Heads (B, h, N, d) -> tokens (B, N, h*d), the inverse of :func:`split_heads`
    (one head: a reshape, no ``Transpose`` in a graph)."""
    if num_heads == 1:
        return x.reshape(x.shape[0], x.shape[2], x.shape[3])
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], num_heads * x.shape[3])


def linear_parts(layer: nn.Linear, x: Tensor, parts: int) -> List[Tensor]:
    """``layer(x).chunk(parts, -1)``, each part its own matrix product with its rows of
    the weight: every part is a dense (..., C) tensor (the values go to the depthwise
    conv without a copy), and none is as large as the whole output (at detection sizes
    a few tens of MB, which the C allocator recycles between steps, where the whole
    output is mapped afresh every time)."""
    biases = [None] * parts if layer.bias is None else layer.bias.chunk(parts)
    weights = layer.weight.chunk(parts)
    return [token_rows(partial(F.linear, weight=w, bias=b), x) for w, b in zip(weights, biases)]


def with_ones(x: Tensor) -> Tensor:
    """Tokens (B, N, C) with a column of ones appended: (B, N, C + 1)."""
    return torch.cat([x, x.new_ones(x.shape[0], x.shape[1], 1)], dim=-1)


def channels_first_projection(rows: Tuple[Tensor, Optional[Tensor]], tokens: Tensor) -> Tensor:
    """``W tokens^T + b`` (B, C_out, N) of ``rows`` = (W, b (C_out, 1) or None); tokens
    (B, N, C_in), or (B, N, C_in + 1) with a column of ones (:func:`with_ones`), which
    the bias then multiplies inside the product."""
    weight, bias = rows
    if tokens.shape[-1] == weight.shape[-1] + 1:
        if bias is None:
            return torch.matmul(weight, tokens[..., :-1].transpose(-2, -1))
        return torch.matmul(torch.cat([weight, bias], dim=1), tokens.transpose(-2, -1))
    out = torch.matmul(weight, tokens.transpose(-2, -1))
    return out if bias is None else out + bias


@MODELS.register_module()
class PolaLinearAttention(nn.Module):
    """Polarity-aware linear attention (PolaFormer) on any grid.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads h; the head width is C / h.
        pos_grid (Sequence[int]): (H0, W0), the key grid the positional encoding
            ``P`` was learned on (after spatial reduction). At run time ``P`` is
            resized (bicubic) to the actual key grid when they differ.
        sr_ratio (int): Spatial reduction r of keys/values ('pvt' family only).
            Default: 1.
        kernel_size (int): Kernel of the depthwise conv on v, shared by all heads
            (odd). Default: 5.
        alpha (float): The exponent is ``1 + alpha * sigmoid(power)``; finite and
            > 0. Default: 4.0.
        qkv_bias (bool): Bias of the q/k/v/g projections. Default: True.
        family (str): Projections of the official model family: 'pvt' (``qg`` and
            ``kv``, optional spatial reduction) or 'swin' (one ``qkvg``).
            Default: 'pvt'.
        proj_drop (float): Dropout after the output projection. Default: 0.

    Input: tokens (B, H*W, C) on ``hw_shape`` (H, W). Output: (B, H*W, C).
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 pos_grid: Sequence[int],
                 sr_ratio: int = 1,
                 kernel_size: int = 5,
                 alpha: float = 4.0,
                 qkv_bias: bool = True,
                 family: str = 'pvt',
                 proj_drop: float = 0.):
        super().__init__()
        if family not in FAMILIES:
            raise ValueError(f'family must be one of {FAMILIES}, got {family!r}')
        if family == 'swin' and sr_ratio != 1:
            raise ValueError('the swin family has no spatial reduction '
                             f'(sr_ratio must be 1, got {sr_ratio})')
        if sr_ratio < 1 or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f'sr_ratio must be >= 1 and kernel_size odd; got '
                             f'sr_ratio={sr_ratio}, kernel_size={kernel_size}')
        self.pos_grid = tuple(int(s) for s in pos_grid)
        if len(self.pos_grid) != 2 or min(self.pos_grid) < 1:
            raise ValueError(f'pos_grid must be two positive sizes, got {pos_grid}')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = head_dims(embed_dims, num_heads)
        self.sr_ratio = sr_ratio
        self.alpha = check_alpha(alpha)
        self.family = family

        if family == 'swin':
            self.qkvg = nn.Linear(embed_dims, 4 * embed_dims, bias=qkv_bias)
        else:
            self.qg = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
            self.kv = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
            self.reduction = (SpatialReduction(embed_dims, sr_ratio) if sr_ratio > 1 else None)
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
        """The settings shown by ``print(module)``."""
        return (f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, '
                f'family={self.family!r}, sr_ratio={self.sr_ratio}, '
                f'alpha={self.alpha}, pos_grid={self.pos_grid}')

    def projection_rows(self) -> Dict[str, Tuple[str, slice]]:
        """Where the query, key, value and gate projections live: role ('q', 'k',
        'v', 'g') -> (name of the linear layer, its output rows), in the order
        :meth:`project` splits them ('pvt': ``qg`` = [q; g], ``kv`` = [k; v];
        'swin': ``qkvg`` = [q; k; v; g]); each role is h heads of d rows, head-major."""
        C = self.embed_dims
        if self.family == 'swin':
            return {role: ('qkvg', slice(i * C, (i + 1) * C)) for i, role in enumerate('qkvg')}
        return {
            'q': ('qg', slice(0, C)),
            'g': ('qg', slice(C, 2 * C)),
            'k': ('kv', slice(0, C)),
            'v': ('kv', slice(C, 2 * C))
        }

    def key_grid(self, hw_shape: Sequence[int]) -> Tuple[int, int]:
        """The grid of the keys for queries on ``hw_shape`` (ceil after reduction)."""
        r = self.sr_ratio
        # (s + r - 1) // r, not -(-s // r): the TorchScript exporter writes a floor
        # division of integers as ONNX Div, which truncates negative quotients
        return ((hw_shape[0] + r - 1) // r, (hw_shape[1] + r - 1) // r)

    def project(self,
                x: Tensor,
                hw_shape: Sequence[int],
                padding_mask: Optional[Tensor] = None,
                pos_encoding: Optional[Tensor] = None) -> AttentionInputs:
        """The inputs of the attention maths for the tokens ``x`` (B, H*W, C) on
        ``hw_shape`` (H, W): queries and keys divided by ``softplus(scale)``, ``P``
        added to the keys, split into heads; the values; the gate; the ``eps`` of
        every batch entry; the key grid. The arguments are those of
        :meth:`_project`."""
        return self._project(x, hw_shape, padding_mask, pos_encoding, divide=True)[0]

    def _project(self,
                 x: Tensor,
                 hw_shape: Sequence[int],
                 padding_mask: Optional[Tensor] = None,
                 pos_encoding: Optional[Tensor] = None,
                 divide: bool = True) -> Tuple[AttentionInputs, Tensor]:
        """:meth:`project`, and ``softplus(scale)`` as (1, h, 1, d); with
        ``divide=False`` queries and keys are not divided by it (the op does that
        in its features: ``pola_linear_attention(..., scale=...)``).

        Args:
            x (Tensor): Tokens (B, H*W, C).
            hw_shape (Sequence[int]): (H, W).
            padding_mask (Tensor, optional): (B, H*W) bool, True where a token was
                added by padding ('swin' family: windowed stages pad maps to a
                multiple of the window). Such tokens take no part as keys or
                values: their keys and values are set to zero (zero keys have zero
                polarity features, so they add nothing to ``K^T V`` or the key
                means; zero values add nothing to the depthwise conv, as the conv's
                own zero padding at a window border), and the normaliser is that of
                the real keys alone. Their outputs are meaningless: the caller drops
                them.
            pos_encoding (Tensor, optional): ``P`` already laid out on the key grid
                (1, h*w, C), e.g. resized for all blocks of a stage at once by
                :class:`~polaformer_mm.models.utils.StagePositionalEncodings`; None
                resizes ``P`` here.
            divide (bool): Divide queries and keys by ``softplus(scale)``.
                Default: True.
        """
        B, N, C = x.shape
        H, W = hw_shape
        check_sizes(lambda: None if N == H * W and C == self.embed_dims else
                    f'PolaLinearAttention expects (B, {H}*{W}, {self.embed_dims}) tokens for '
                    f'hw_shape {tuple(hw_shape)}; got {tuple(x.shape)}')
        if self.family == 'swin':
            q, k, v, g = linear_parts(self.qkvg, x, 4)
            kv_hw = (H, W)
        else:
            if padding_mask is not None:
                raise ValueError('padding_mask needs keys on the query grid (the '
                                 "'swin' family)")
            q, g = linear_parts(self.qg, x, 2)
            kv_hw = (H, W)
            if self.reduction is not None:
                x, kv_hw = self.reduction(x, hw_shape)
            k, v = linear_parts(self.kv, x, 2)

        if pos_encoding is None:
            pos_encoding = resize_token_grid(
                self.positional_encoding, self.pos_grid, kv_hw, mode='bicubic')
        k = k + pos_encoding
        eps = 1e-6
        if padding_mask is not None:
            check_sizes(lambda: None if padding_mask.shape == (B, N) else
                        f'padding_mask must be ({B}, {N}), got {tuple(padding_mask.shape)}')
            keep = (~padding_mask).unsqueeze(-1).to(k.dtype)
            k, v = k * keep, v * keep
            # the op's normaliser is q.sum(K)/n + eps: eps * n_real / n keeps that
            # of the real keys alone
            eps = keep.sum(dim=1).view(B, 1, 1, 1) * (eps / N)
        h, d = self.num_heads, self.head_dims
        q, k, v = (split_heads(t, h, d) for t in (q, k, v))
        scale = F.softplus(self.scale).view(1, h, 1, d)
        if divide:
            q, k = q / scale, k / scale
        return AttentionInputs(q, k, v, g, eps, tuple(kv_hw)), scale

    def forward(self,
                x: Tensor,
                hw_shape: Sequence[int],
                padding_mask: Optional[Tensor] = None,
                pos_encoding: Optional[Tensor] = None) -> Tensor:
        """Attend over the tokens ``x`` (B, H*W, C) laid out on ``hw_shape``;
        the arguments are those of :meth:`project`. Returns (B, H*W, C). An export
        inside :func:`~polaformer_mm.utils.graph_forms.graph_forms` records
        :meth:`forward_channels_first` (:func:`pola_attention_graph_form`), the same
        result in the layout graph runtimes run fastest."""
        (q, k, v, g, eps, _), scale = self._project(
            x, hw_shape, padding_mask, pos_encoding, divide=False)
        out = pola_linear_attention(q, k, v, self.power, self.alpha, eps, scale=scale)
        out = merge_heads(out, self.num_heads)
        out = token_rows(self.proj, (out + self.local_term(v, hw_shape)) * g)
        return self.proj_drop(out)

    def _rows(self, role: str, divisor: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
        """The weight (C, C) and bias (C, 1) of one role of :meth:`projection_rows`,
        divided by ``divisor`` (C, 1) when given (bias None: the layer has none)."""
        name, rows = self.projection_rows()[role]
        layer = getattr(self, name)
        weight = layer.weight[rows]
        bias = None if layer.bias is None else layer.bias[rows].view(-1, 1)
        if divisor is not None:
            weight = weight / divisor
            bias = None if bias is None else bias / divisor
        return weight, bias

    def forward_channels_first(self,
                               x: Tensor,
                               hw_shape: Sequence[int],
                               padding_mask: Optional[Tensor] = None,
                               pos_encoding: Optional[Tensor] = None) -> Tensor:
        """:meth:`forward` (same arguments, same result up to rounding) with heads laid
        out channels first, the form an ONNX export records (its graph form:
        :func:`pola_attention_graph_form`).

        The projections are products ``W x^T`` (B, C, N): ``softplus(scale)`` folded
        into the query and key rows, the biases of the others a column of ``W`` that
        meets a row of ones under ``x^T`` (no pass of their own).
        :func:`~polaformer_mm.ops.pola_attention.channels_first.pola_linear_attention_channels_first`
        takes their per-head views, the depthwise conv the values as the (B, C, H, W)
        map they already are, the output projection the result as ``W_o y``; the one
        transpose is that of the output to tokens. Padding tokens are weights of the
        key means, their values zero (see
        :mod:`~polaformer_mm.ops.pola_attention.channels_first`).
        """
        B, N, C = x.shape
        H, W = hw_shape
        h, d = self.num_heads, self.head_dims
        check_sizes(lambda: None if N == H * W and C == self.embed_dims else
                    f'PolaLinearAttention expects (B, {H}*{W}, {self.embed_dims}) tokens for '
                    f'hw_shape {tuple(hw_shape)}; got {tuple(x.shape)}')
        if padding_mask is not None and self.family != 'swin':
            raise ValueError("padding_mask needs keys on the query grid (the 'swin' family)")
        x_kv, kv_hw = x, (H, W)
        if self.family == 'pvt' and self.reduction is not None:
            x_kv, kv_hw = self.reduction(x, hw_shape)
        n = x_kv.shape[1]
        scale = F.softplus(self.scale).view(C, 1)
        tokens = with_ones(x)
        q = channels_first_projection(self._rows('q', scale), tokens)
        g = channels_first_projection(self._rows('g', None), tokens)
        kv_tokens = tokens if x_kv is x else with_ones(x_kv)
        v = channels_first_projection(self._rows('v', None), kv_tokens)
        k = channels_first_projection(self._rows('k', scale), kv_tokens)
        k = k + self.key_shift_channels_first(pos_encoding, kv_hw, scale)
        eps, key_weights = 1e-6, None
        if padding_mask is not None:
            check_sizes(lambda: None if padding_mask.shape == (B, N) else
                        f'padding_mask must be ({B}, {N}), got {tuple(padding_mask.shape)}')
            keep = (~padding_mask).to(x.dtype).view(B, 1, N)
            v = v * keep
            key_weights = keep.view(B, 1, N, 1)
            eps = keep.sum(dim=2).view(B, 1, 1, 1) * (eps / N)
        out = pola_linear_attention_channels_first(
            q.view(B, h, d, N), k.view(B, h, d, n), v.view(B, h, d, n), self.power, self.alpha, eps,
            key_weights)
        y = (out.reshape(B, C, N) + self._local_term_channels_first(v, hw_shape)) * g
        return self._output_tokens(y)

    def key_shift_channels_first(self, pos_encoding: Optional[Tensor], kv_hw: Sequence[int],
                                 scale: Tensor) -> Tensor:
        """What :meth:`forward_channels_first` adds to its keys (their projection, bias
        included, divided by ``softplus(scale)``): ``P / softplus(scale)`` on the key grid
        ``kv_hw``, channels first (C, n); ``scale``: ``softplus(scale)`` as (C, 1).

        ``pos_encoding`` None: ``P`` is divided on its own grid and then resized
        (:func:`~polaformer_mm.models.utils.resize_channels_first`: the resize is linear,
        so this is ``P`` resized, then divided, up to rounding): a quotient of parameters,
        which an export folds into one constant, and a resize that writes the
        channels-first layout. Given (``P`` already on the key grid, (1, n, C) tokens),
        it is transposed and divided."""
        C = self.embed_dims
        if pos_encoding is None:
            shift = self.positional_encoding.reshape(-1, C).t() / scale
            return resize_channels_first(shift, self.pos_grid, kv_hw, mode='bicubic')
        return pos_encoding.reshape(-1, C).t() / scale

    def _output_tokens(self, y: Tensor) -> Tensor:
        """The output projection ``W_o y + b`` of channels-first ``y`` (B, C, N), as
        tokens (B, N, C) (the one transpose of :meth:`forward_channels_first`), then
        ``proj_drop``."""
        y = torch.matmul(self.proj.weight, y)
        if self.proj.bias is not None:
            y = y + self.proj.bias.view(-1, 1)
        return self.proj_drop(y.transpose(1, 2).contiguous())

    def _local_term_channels_first(self, v: Tensor, hw_shape: Sequence[int]) -> Tensor:
        """:meth:`local_term` of channels-first values ``v`` (B, C, n): (B, C, H*W)."""
        B, C, n = v.shape
        H, W = hw_shape
        h, d = self.num_heads, self.head_dims
        if self.sr_ratio > 1:  # as local_term: 1-D linear stretch of the key sequence
            v = F.interpolate(v.reshape(B * h, d, n), size=H * W, mode='linear')
        v = v.reshape(B, C, H, W)
        return self._depthwise_all_heads(v).reshape(B, C, H * W)

    def _depthwise_all_heads(self, v: Tensor) -> Tensor:
        """``dwc`` (one kernel shared by the heads) on a (B, C, H, W) map of all
        C = h*d channels: the kernel repeated per head (channel head * d + j uses
        kernel j)."""
        h = self.num_heads
        bias = None if self.dwc.bias is None else self.dwc.bias.repeat(h)
        return depthwise_conv(v, self.dwc.weight.repeat(h, 1, 1, 1), bias)

    def local_term(self, v: Tensor, hw_shape: Sequence[int]) -> Tensor:
        """The depthwise conv of the values ``v`` (B, h, n, d) on the query grid
        ``hw_shape`` (H, W), as tokens (B, H*W, C)."""
        B, n = v.shape[0], v.shape[2]
        H, W = hw_shape
        h, d, C, N = self.num_heads, self.head_dims, self.embed_dims, H * W
        # One depthwise conv shared by all heads, run as one depthwise conv over all
        # C = h*d channels with the kernel repeated per head (channel head * d + j uses
        # kernel j), on v in its token layout (B, N, C) seen as a channels-last map: no
        # per-head copies of v or of the result.
        # the branch follows the structure, not the sizes (keys on the query grid
        # without reduction; with it, an interpolation to the same size of a one-token
        # map changes nothing), so that a captured graph serves every size
        if self.sr_ratio > 1:
            # the official code stretches the flattened key sequence (1-D linear).
            v = F.interpolate(v.transpose(-2, -1).reshape(B * h, d, n), size=N, mode='linear')
            v = v.reshape(B, C, H, W).contiguous(memory_format=torch.channels_last)
        else:
            v = merge_heads(v, h).reshape(B, H, W, C).permute(0, 3, 1, 2)
        return self._depthwise_all_heads(v).permute(0, 2, 3, 1).reshape(B, N, C)


@register_graph_form(PolaLinearAttention)
def pola_attention_graph_form(module: PolaLinearAttention, *args, **kwargs) -> Tensor:
    """The graph form of :class:`PolaLinearAttention` and of its subclasses
    (:mod:`polaformer_mm.utils.graph_forms`): the module's ``forward_channels_first``,
    with the arguments of its ``forward`` (a subclass that overrides both keeps them
    paired)."""
    return module.forward_channels_first(*args, **kwargs)


class SpatialReductionAttention(nn.Module):
    """PVT v1 softmax attention with spatially reduced keys/values ('S' stages).

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads.
        sr_ratio (int): Spatial reduction of keys/values. Default: 1.
        qkv_bias (bool): Bias of the q/kv projections. Default: True.
        attn_drop (float): Dropout on the attention weights. Default: 0.
        proj_drop (float): Dropout after the output projection. Default: 0.

    Input: tokens (B, H*W, C) on ``hw_shape``. Output: (B, H*W, C).
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sr_ratio: int = 1,
                 qkv_bias: bool = True,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.):
        super().__init__()
        self.num_heads = num_heads
        self.head_dims = head_dims(embed_dims, num_heads)
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = nn.Linear(embed_dims, 2 * embed_dims, bias=qkv_bias)
        self.reduction = (SpatialReduction(embed_dims, sr_ratio) if sr_ratio > 1 else None)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, hw_shape: Sequence[int]) -> Tensor:
        """Softmax attention of every token over the reduced tokens."""
        B, N, C = x.shape
        q = token_rows(self.q, x).reshape(B, N, self.num_heads, self.head_dims).transpose(1, 2)
        if self.reduction is not None:
            x, _ = self.reduction(x, hw_shape)
        k, v = token_rows(self.kv, x).reshape(B, -1, 2, self.num_heads,
                                              self.head_dims).permute(2, 0, 3, 1, 4).unbind(0)
        dropout = self.attn_drop if self.training else 0.
        out = softmax_attention(q, k, v, self.head_dims, dropout, self.training)
        out = out.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(token_rows(self.proj, out))


def relative_position_index(window_size: int) -> Tensor:
    """Index into the (2w-1)^2 bias table for every (query, key) pair of a window."""
    coords = torch.stack(
        torch.meshgrid(torch.arange(window_size), torch.arange(window_size),
                       indexing='ij')).flatten(1)  # (2, w*w): row, col
    rel = coords[:, :, None] - coords[:, None, :] + window_size - 1
    return rel[0] * (2 * window_size - 1) + rel[1]


class WindowMSA(nn.Module):
    """Swin window self-attention with a relative position bias ('S' stages).

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads.
        window_size (int): Side w of the square windows.
        qkv_bias (bool): Bias of the qkv projection. Default: True.
        attn_drop (float): Dropout on the attention weights. Default: 0.
        proj_drop (float): Dropout after the output projection. Default: 0.

    Input: windows (B*nW, w*w, C) and an optional additive mask (nW, w*w, w*w).
    Output: (B*nW, w*w, C).
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 window_size: int,
                 qkv_bias: bool = True,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.):
        super().__init__()
        self.num_heads = num_heads
        self.head_dims = head_dims(embed_dims, num_heads)
        self.window_size = window_size
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size - 1)**2, num_heads))
        self.register_buffer(
            'relative_position_index', relative_position_index(window_size), persistent=False)
        self.qkv = nn.Linear(embed_dims, 3 * embed_dims, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """Attention within each window, with the relative position bias and the
        additive ``mask`` (per window, shared by the batch)."""
        Bw, T, C = x.shape
        qkv = token_rows(self.qkv, x).reshape(Bw, T, 3, self.num_heads,
                                              self.head_dims).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.head_dims**-0.5) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(
            T, T, -1)
        attn = attn + bias.permute(2, 0, 1).unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(Bw // nW, nW, self.num_heads, T, T) + mask[:, None]
            attn = attn.view(Bw, self.num_heads, T, T)
        attn = self.attn_drop(attn.softmax(dim=-1))
        out = (attn @ v).transpose(1, 2).reshape(Bw, T, C)
        return self.proj_drop(token_rows(self.proj, out))
