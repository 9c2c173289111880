"""Small building blocks shared by the Pola backbones.

Graph capture is decided here for the layers: every building block with an eager fast
path and a plain form that a graph records (:func:`polaformer_mm.utils.capture.graph_capture`)
makes that choice itself, once, and the layers only call it:

* :func:`check_sizes`: size checks in Python, eager only (a graph leaves them to the
  runtime);
* :func:`pad_to_multiple`: padding by amounts the graph computes (always, possibly by 0);
* :func:`pad_for_patches`: the padding before a patchifying convolution, or a constant
  one that graph runtimes fold into the convolution;
* :func:`token_rows`: a per-token layer on (..., C) tokens, or on the tokens flattened
  to (T, C) rows (a linear layer is then one ``Gemm`` with its bias, where a 3-D input
  records a ``MatMul`` and a separate ``Add``);
* :func:`resize_token_grid`: interpolation by cached matrices, or matrix products with
  interpolation matrices recorded in the graph;
* :class:`StagePositionalEncodings`: resized encodings cached per grid, or recorded;
* :func:`window_layout`: the Swin window layout cached per size, or recorded;
* :func:`depthwise_conv`: :func:`~polaformer_mm.ops.depthwise_conv2d`, or ``F.conv2d``;
* :func:`softmax_attention`: ``F.scaled_dot_product_attention``, or its maths in the
  operators of every ONNX opset;
* :class:`Mlp`: :func:`~polaformer_mm.ops.mlp_gelu` over blocks of tokens, or module by
  module on token rows.

The attention op itself decides in its dispatch (:mod:`polaformer_mm.ops.pola_attention`).
"""
from functools import lru_cache
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmcv.cnn import build_activation_layer, build_norm_layer
from torch import Tensor

from ..ops.blocked_mlp import mlp_gelu
from ..ops.depthwise_conv import depthwise_conv2d
from ..utils.capture import graph_capture
from ..utils.compat import is_autocast_enabled
from .window_geometry import (captured_window_layout, window_gather, window_mask, window_padding,
                              window_shift)


def check_sizes(error: Callable[[], Optional[str]]) -> None:
    """Raise a ValueError with the message ``error()`` returns, unless it returns None.

    Eager only: in a graph capture sizes are symbols of the graph (a trace sees them as
    tensors), which a Python branch would fix at the captured values, so the checks are
    left to the runtime there and ``error`` is not called.
    """
    if graph_capture():
        return
    message = error()
    if message is not None:
        raise ValueError(message)


def token_rows(layer: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``layer(x)`` for a layer that acts on every token alone (a linear layer, an MLP)
    of tokens ``x`` (..., C). In a graph capture the layer takes the tokens as (T, C)
    rows and its result is laid out as ``x``: a linear layer on a 2-D input is recorded
    as one ``Gemm`` with its bias (graph runtimes fuse the bias into the product), on a
    3-D input as a ``MatMul`` and an ``Add``, a second pass over the whole output."""
    if not graph_capture() or x.dim() == 2:
        return layer(x)
    out = layer(x.reshape(-1, x.shape[-1]))
    return out.reshape(x.shape[:-1] + out.shape[-1:])


def nlc_to_nchw(x: Tensor, hw_shape: Sequence[int]) -> Tensor:
    """Tokens (B, H*W, C) -> map (B, C, H, W): a channels-last view of contiguous tokens.
    In a graph the 4-D ``Transpose`` comes last, so that it writes a graph output itself
    (a ``Reshape`` into an output is a copy)."""
    H, W = hw_shape
    B, N, C = x.shape
    check_sizes(lambda: None if N == H * W else f'token count {N} does not match the grid '
                f'{H}x{W}')
    return x.reshape(B, H, W, C).permute(0, 3, 1, 2)


def nchw_to_nlc(x: Tensor) -> Tensor:
    """Map (B, C, H, W) -> tokens (B, H*W, C): a view of a channels-last map. In a graph
    the 4-D ``Transpose`` to channels-last comes first, which onnxruntime folds into the
    layout change after a convolution."""
    B, C, H, W = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, H * W, C)


def pad_to_multiple(x: Tensor, multiple: int) -> Tensor:
    """Zero-pad a (B, C, H, W) map on the bottom/right to multiples of ``multiple``
    (under a graph capture always, by amounts the graph computes from the sizes)."""
    H, W = x.shape[-2:]
    pad_h = (-H) % multiple
    pad_w = (-W) % multiple
    if graph_capture() or pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return x


def pad_for_patches(x: Tensor, patch: int) -> Tensor:
    """Zero-pad a (B, C, H, W) map on the bottom/right for a convolution with kernel =
    stride = ``patch`` that covers every pixel (``ceil(H / patch)`` windows): eagerly to
    multiples of ``patch`` (:func:`pad_to_multiple`); under a graph capture by ``patch -
    1`` on both sides, whatever the size. The convolution's windows and output are the
    same (the extra zeros lie past its last window), and a constant padding is one that
    graph runtimes fold into the convolution (onnxruntime does), where a padding by
    amounts the graph computes is a copy of the whole map."""
    if not graph_capture():
        return pad_to_multiple(x, patch)
    return F.pad(x, (0, patch - 1, 0, patch - 1)) if patch > 1 else x


def conv_token_map(conv: nn.Conv2d, x: Tensor) -> Tensor:
    """``conv(x)``; for a token map (tokens (B, H*W, C) viewed as (B, C, H, W): the
    channels-last layout) the convolution runs channels-last, with the weight laid
    out to match: with a plain weight the CPU convolution copies such an input to
    plain NCHW in the forward pass and again in the backward pass, and returns a
    plain output, whose tokens the next LayerNorm copies once more. The result is
    then channels-last, so that its tokens ``flatten(2).transpose(1, 2)`` are
    contiguous. The same values up to rounding."""
    if x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last):
        return conv(x)
    return conv._conv_forward(x, conv.weight.contiguous(memory_format=torch.channels_last),
                              conv.bias)


@lru_cache(maxsize=128)
def interpolation_matrix(src: int, dst: int, mode: str, device: torch.device,
                         dtype: torch.dtype) -> Tensor:
    """The (dst, src) matrix ``A`` with ``A @ x`` = ``F.interpolate`` of ``x`` along
    one axis from ``src`` to ``dst`` samples (``align_corners=False``): the weights
    of PyTorch's own kernel, read off by interpolating the identity (in float64)."""
    eye = torch.eye(src, dtype=torch.float64).view(src, 1, src, 1)
    weights = F.interpolate(eye, size=(dst, 1), mode=mode, align_corners=False)
    return weights.view(src, dst).t().to(device=device, dtype=dtype).contiguous()


def _captured_interpolation_matrix(src: int, dst, mode: str, like: Tensor) -> Tensor:
    """:func:`interpolation_matrix` as a graph records it: the (dst, src) matrix read off
    by interpolating the ``src`` x ``src`` identity (a constant) to ``dst`` samples, a
    size the graph computes (a resize of ``src * dst`` values)."""
    eye = torch.eye(src, dtype=like.dtype, device=like.device).reshape(1, src, src, 1)
    weights = F.interpolate(eye, size=(dst, 1), mode=mode, align_corners=False)
    return weights.reshape(src, -1).transpose(0, 1)


def _captured_resize_token_grid(tokens: Tensor, src_hw: Tuple[int, int], dst_hw: Sequence,
                                mode: str) -> Tensor:
    """:func:`resize_token_grid` in a graph capture, for any ``dst_hw`` the graph computes:
    two matrix products with the interpolation matrices of the axes, themselves resizes of
    identities in the graph (:func:`_captured_interpolation_matrix`), the columns of the
    small source grid first. The same weights as ``F.interpolate``'s, and the same results
    up to rounding, where a runtime's Resize of the whole (T, C, Hd, Wd) grid can take many
    times longer (onnxruntime's bicubic one does) and its channels-first result needs a
    ``Transpose`` to the token layout; the second product writes the tokens directly.
    """
    T, _, C = tokens.shape
    (Hs, Ws), (Hd, Wd) = src_hw, dst_hw
    rows = _captured_interpolation_matrix(Hs, Hd, mode, tokens)
    cols = _captured_interpolation_matrix(Ws, Wd, mode, tokens)
    x = torch.matmul(cols, tokens.reshape(T * Hs, Ws, C))  # (T*Hs, Wd, C)
    x = torch.matmul(rows, x.reshape(T, Hs, -1))  # (T, Hd, Wd*C)
    return x.reshape(T, -1, C)


def resize_channels_first(maps: Tensor, src_hw: Sequence[int], dst_hw: Sequence[int],
                          mode: str) -> Tensor:
    """Resize (C, Hs*Ws) channels-first maps laid out on ``src_hw`` to ``dst_hw``:
    (C, Hd*Wd), the transpose of :func:`resize_token_grid`'s result for the transposed
    input (the same weights, the same values up to rounding). The second product writes
    the channels-first result directly, so a graph that adds it to channels-first tensors
    needs no ``Transpose``. The resize of the channels-first graph form of the Pola
    attention: its interpolation matrices are read off in the tensor operations at every
    call (:func:`_captured_interpolation_matrix`, identities where the grids agree), so
    the same operations serve an eager call and any size a graph computes."""
    C = maps.shape[0]
    (Hs, Ws), (Hd, Wd) = tuple(src_hw), tuple(dst_hw)
    rows = _captured_interpolation_matrix(Hs, Hd, mode, maps)
    cols = _captured_interpolation_matrix(Ws, Wd, mode, maps)
    x = torch.matmul(maps.reshape(C * Hs, Ws), cols.transpose(0, 1))  # (C*Hs, Wd)
    x = torch.matmul(rows, x.reshape(C, Hs, -1))  # (C, Hd, Wd)
    return x.reshape(C, -1)


def resize_token_grid(tokens: Tensor, src_hw: Sequence[int], dst_hw: Sequence[int],
                      mode: str) -> Tensor:
    """Resize (T, Hs*Ws, C) tokens laid out on ``src_hw`` to ``dst_hw``: the result
    of ``F.interpolate(..., mode, align_corners=False)`` ('bilinear' or 'bicubic';
    both are separable) up to rounding, as (T, Hd*Wd, C) contiguous tokens.

    Computed as two matrix products with the interpolation matrices of the two axes
    (cached per size), in the token layout: no channels-first copies, and a
    backward pass that is two matrix products too (the CPU backward of
    ``F.interpolate`` is a slow scatter). Returned as they are when the grids agree.
    Under a graph capture (FLOP counting, export, ``torch.compile``) the matrices are
    computed in the graph (:func:`_captured_resize_token_grid`) at every call (also where
    the grids agree at capture time: a captured ``dst_hw`` stands for any size), and no
    matrix is cached.
    """
    src_hw, dst_hw = tuple(src_hw), tuple(dst_hw)
    T, N, C = tokens.shape
    (Hs, Ws), (Hd, Wd) = src_hw, dst_hw
    if graph_capture():
        return _captured_resize_token_grid(tokens, src_hw, dst_hw, mode)
    if src_hw == dst_hw:
        return tokens
    if N != Hs * Ws:
        raise ValueError(f'{N} tokens cannot be laid out on a {src_hw} grid')
    rows = interpolation_matrix(Hs, Hd, mode, tokens.device, tokens.dtype)
    cols = interpolation_matrix(Ws, Wd, mode, tokens.device, tokens.dtype)
    x = torch.matmul(rows, tokens.reshape(T, Hs, Ws * C))  # (T, Hd, Ws*C)
    x = torch.matmul(cols, x.reshape(T * Hd, Ws, C))  # (T*Hd, Wd, C)
    return x.reshape(T, Hd * Wd, C)


class StagePositionalEncodings:
    """The positional encodings of a stage's Pola blocks on the runtime key grid.

    All ``P`` that need resizing to the same grid are resized in one bicubic call
    (gradients still reach every block's own ``P``). With gradients off (inference) the
    result is kept per key grid until a ``P`` changes (its version counter), device or
    dtype; with gradients on it is computed at every call. Under a graph capture (trace,
    export, ``torch.compile``) it gives None for every module: each resizes its own
    ``P`` by recorded operators, whatever the grids at capture time (a captured grid
    stands for any size), in the layout its graph form adds it in (a graph runtime
    copies the parts of a stacked resize, and the channels-first form of
    :class:`~polaformer_mm.models.attention.PolaLinearAttention` resizes ``P`` already
    divided by its scale: one constant before the resize); nothing is cached.
    """

    def __init__(self):
        self._key = None
        self._value: List[Optional[Tensor]] = []

    def __call__(self, modules: Sequence[nn.Module],
                 hw_shape: Sequence[int]) -> List[Optional[Tensor]]:
        """One entry per module: the resized ``P`` of a
        :class:`~polaformer_mm.models.attention.PolaLinearAttention` whose grid differs
        from its key grid, else None (the module uses its own ``P``, or is no Pola
        module: None, or a module without ``positional_encoding``)."""
        todo = [] if graph_capture() else [
            i for i, m in enumerate(modules) if getattr(m, 'positional_encoding', None) is not None
            and m.key_grid(hw_shape) != m.pos_grid
        ]
        if not todo:
            return [None] * len(modules)
        params = [modules[i].positional_encoding for i in todo]
        cache = not torch.is_grad_enabled()
        if cache:
            key = (tuple(hw_shape), tuple(todo),
                   tuple((id(p), p._version, p.device, p.dtype) for p in params))
            if key == self._key:
                return self._value
        out: List[Optional[Tensor]] = [None] * len(modules)
        groups = {}
        for i in todo:
            m = modules[i]
            # the key grid follows from the reduction
            groups.setdefault((m.pos_grid, m.sr_ratio), []).append(i)
        for (src, _), indices in groups.items():
            dst = modules[indices[0]].key_grid(hw_shape)
            stacked = torch.cat([modules[i].positional_encoding for i in indices])
            resized = resize_token_grid(stacked, src, dst, mode='bicubic')
            for i, encoding in zip(indices, resized.split(1)):
                out[i] = encoding
        if cache:
            self._key, self._value = key, out
        return out


class WindowLayout(NamedTuple):
    """The Swin window layout of a map (:func:`window_layout`)."""
    to_windows: Tensor  #: (nW * T,) index of every window token in the padded map
    from_windows: Tensor  #: (H * W,) position of every real token among the window tokens
    padding: Optional[Tensor]  #: (nW, T) bool, True at padding; None: no padding
    mask: Optional[Tensor]  #: (nW, T, T) additive softmax mask; None: nothing masked


def window_layout(hw_shape: Sequence[int],
                  window_size: int,
                  shifted: bool,
                  device: torch.device,
                  dtype: torch.dtype,
                  softmax_mask: bool = True) -> WindowLayout:
    """The window layout of an H x W map of a (shifted) Swin block
    (:mod:`~polaformer_mm.models.window_geometry`): cached per size and without masks
    where nothing is padded or shifted in eager runs; in a graph capture computed by
    the graph from the sizes, the masks always given (all-real windows: no key
    dropped, an all-zero softmax mask), so that the graph holds no decision on the
    sizes it was captured at. The softmax mask is given in ``dtype``; with
    ``softmax_mask=False`` (the linear windows, which take the padding only) it is
    None, never computed: it holds T x T values per window, where T is the window's
    token count (3136 for the 56 x 56 windows of Pola-Swin)."""
    ws = window_size
    if graph_capture():
        H, W = hw_shape
        to_windows, from_windows, regions = captured_window_layout(H, W, ws, shifted, device)
        mask = None
        if softmax_mask:
            differ = regions[:, :, None] != regions[:, None, :]
            zeros = torch.zeros(differ.shape, dtype=dtype, device=device)
            mask = zeros.masked_fill(differ, float('-inf'))
        return WindowLayout(to_windows, from_windows, regions < 0, mask)
    H, W = (int(s) for s in hw_shape)  # plain ints: keys of the cached layouts
    shift = window_shift((H, W), ws, shifted)
    to_windows, from_windows = window_gather(H, W, ws, shift, device)
    mask = window_mask(H, W, ws, shift, device) if softmax_mask else None
    return WindowLayout(to_windows, from_windows, window_padding(H, W, ws, shift, device),
                        None if mask is None else mask.to(dtype))


def depthwise_conv(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """Depthwise convolution of ``x`` (B, C, H, W) with ``weight`` (C, 1, k, k), odd k,
    'same' zero padding: :func:`~polaformer_mm.ops.depthwise_conv2d` (its fast CPU
    backward) in eager runs, ``F.conv2d`` in a graph capture."""
    if graph_capture():
        # the weight's sizes are constants of the graph; older torch traces them as
        # tensors, which conv2d's padding and groups do not take
        k, C = int(weight.shape[-1]), int(weight.shape[0])
        return F.conv2d(x, weight, bias, padding=k // 2, groups=C)
    return depthwise_conv2d(x, weight, bias)


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, head_dims: int, dropout_p: float,
                      training: bool) -> Tensor:
    """``softmax(q k^T / sqrt(d)) v`` of heads q (B, h, N, d), k and v (B, h, n, d)
    (``head_dims`` = d, a constant), with dropout ``dropout_p`` on the weights (0 unless
    ``training``): ``F.scaled_dot_product_attention`` in eager runs; in a graph capture
    the same maths in the operators of every ONNX opset (SDPA needs opset 14)."""
    if graph_capture():
        attn = torch.matmul(q * head_dims**-0.5, k.transpose(-2, -1)).softmax(dim=-1)
        return torch.matmul(F.dropout(attn, dropout_p, training), v)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)


def run_blocks(blocks: Sequence[nn.Module],
               x: Tensor,
               hw_shape: Sequence[int],
               with_cp: bool = False,
               extra_args: Optional[Sequence[Optional[Tensor]]] = None) -> Tensor:
    """Run ``block(x, hw_shape[, extra])`` for every block in turn; with ``with_cp``
    (and gradients needed) each block is recomputed in the backward pass instead of
    keeping its activations (``torch.utils.checkpoint``, non-reentrant)."""
    if extra_args is None:
        extra_args = [None] * len(blocks)
    for block, extra in zip(blocks, extra_args):
        args = (x, hw_shape) if extra is None else (x, hw_shape, extra)
        if with_cp and x.requires_grad:
            x = cp.checkpoint(block, *args, use_reentrant=False)
        else:
            x = block(*args)
    return x


class PatchEmbed(nn.Module):
    """Conv patchify (kernel = stride = ``patch_size``) + norm.

    Inputs whose sides are not multiples of the patch are zero-padded on the
    bottom/right, so output sizes are ``ceil(H / patch_size)``.

    Args:
        in_channels (int): Channels of the input map.
        embed_dims (int): Output channels C.
        patch_size (int): Kernel and stride of the projection.
        norm_cfg (dict): Norm after the projection. Default: ``dict(type='LN')``.

    Input: (B, in_channels, H, W). Output: tokens (B, h*w, C) and (h, w).
    """

    def __init__(self,
                 in_channels: int,
                 embed_dims: int,
                 patch_size: int,
                 norm_cfg: dict = dict(type='LN')):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, kernel_size=patch_size, stride=patch_size)
        self.norm = build_norm_layer(norm_cfg, embed_dims)[1]

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """Patch tokens and their grid (see the class docstring)."""
        x = conv_token_map(self.proj, pad_for_patches(x, self.patch_size))
        hw_shape = (x.shape[2], x.shape[3])
        return self.norm(nchw_to_nlc(x)), hw_shape


class Mlp(nn.Module):
    """fc1 - activation - dropout - fc2 - dropout (the official blocks' MLP).

    Args:
        embed_dims (int): Input and output channels.
        hidden_dims (int): Hidden channels.
        drop (float): Dropout after the activation and after fc2. Default: 0.
        act_cfg (dict): Activation. Default: ``dict(type='GELU')``.

    Input and output: (..., embed_dims).
    """

    def __init__(self,
                 embed_dims: int,
                 hidden_dims: int,
                 drop: float = 0.,
                 act_cfg: dict = dict(type='GELU')):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = build_activation_layer(act_cfg)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        """The MLP of every token: on the CPU with GELU and no active dropout, by
        :func:`~polaformer_mm.ops.mlp_gelu` (blocks of tokens; the same maths with a
        fraction of the memory traffic), else module by module (:func:`token_rows`)."""
        if self._blocked(x):
            return mlp_gelu(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias,
                            self.act.approximate)
        return token_rows(self._modules_in_turn, x)

    def _modules_in_turn(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))

    def _blocked(self, x: Tensor) -> bool:
        return (x.device.type == 'cpu' and x.dtype in (torch.float32, torch.float64)
                and type(self.act) is nn.GELU and not (self.training and self.drop.p > 0)
                and not is_autocast_enabled('cpu') and not graph_capture())


def drop_path_rates(drop_path_rate: float, depths: Sequence[int]) -> List[List[float]]:
    """Linearly increasing stochastic-depth rates, split per stage."""
    # on the CPU whatever the default device (a twin built on the meta device)
    rates = torch.linspace(0, drop_path_rate, sum(depths), device='cpu').tolist()
    out, start = [], 0
    for depth in depths:
        out.append(rates[start:start + depth])
        start += depth
    return out
