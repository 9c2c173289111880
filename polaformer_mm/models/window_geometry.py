"""Window geometry of the Swin stages: partition and reverse, the shift, the padding and
the masks, for an H x W map of tokens in windows of ``window_size`` x ``window_size``.

The layout is the official Swin one: the map is zero-padded at the bottom and right to
multiples of the window (:func:`padded_size`), shifted blocks roll it by ``-shift``
(:func:`window_shift`), and windows are taken in row-major order, tokens row-major within
each (:func:`window_partition`, :func:`window_reverse`).

:func:`window_layout` computes that layout once, as tensor operations on the sizes: the
gather indices each way and the shift region (0..8) of every window token (-1 for
padding). Eager runs take it cached per size (:func:`window_gather`, :func:`window_regions`,
and the masks made of the regions: :func:`window_mask` for softmax windows,
:func:`window_padding` for linear windows); a graph capture records it
(:func:`captured_window_layout`, sizes that may be 0-dim tensors of a trace, the shift
decided by the graph), so that one captured graph serves any map size. Used by
:class:`~polaformer_mm.models.backbones.pola_swin.SwinBlock` (through
:func:`polaformer_mm.models.utils.window_layout`), the tools and the tests.
"""
from functools import lru_cache
from typing import Sequence, Tuple

import torch
from torch import Tensor

__all__ = [
    'window_partition', 'window_reverse', 'padded_size', 'window_shift', 'window_regions',
    'window_layout', 'window_gather', 'window_mask', 'window_padding', 'captured_window_layout'
]


def window_partition(x: torch.Tensor, window_size: int) -> torch.Tensor:
    """(B, Hp, Wp, ...) -> (B * nW, window_size**2, ...), windows in row-major order."""
    B, Hp, Wp = x.shape[:3]
    rest = x.shape[3:]
    x = x.view(B, Hp // window_size, window_size, Wp // window_size, window_size, *rest)
    x = x.transpose(2, 3)
    return x.reshape(-1, window_size * window_size, *rest)


def window_reverse(windows: torch.Tensor, window_size: int, Hp: int, Wp: int) -> torch.Tensor:
    """(B * nW, window_size**2, C) -> (B, Hp, Wp, C), the inverse of window_partition."""
    C = windows.shape[-1]
    x = windows.view(-1, Hp // window_size, Wp // window_size, window_size, window_size, C)
    return x.transpose(2, 3).reshape(-1, Hp, Wp, C)


def padded_size(size: int, window_size: int) -> int:
    """``size`` rounded up to a multiple of ``window_size`` (an int, or a 0-dim tensor
    under a trace)."""
    # not -(-size // w): the TorchScript exporter writes an integer floor division as
    # ONNX Div, which truncates negative quotients
    return (size + window_size - 1) // window_size * window_size


def window_shift(hw_shape: Sequence, window_size: int, shifted: bool):
    """Half a window on shifted blocks, when the map is larger than one window along
    both sides; 0 otherwise (a map no larger than the window along its shorter side
    is one window row, never shifted: the official rule). For sizes given as 0-dim
    tensors (a trace) the shift is a 0-dim tensor the graph computes."""
    H, W = hw_shape
    if not shifted:
        return 0
    if isinstance(H, Tensor):
        return (torch.minimum(H, W) > window_size).to(torch.long) * (window_size // 2)
    return window_size // 2 if min(H, W) > window_size else 0


def window_layout(H, W, window_size: int, shift, device: torch.device):
    """The window layout of an H x W map: ``(to_windows, from_windows, regions)``.

    ``to_windows`` (nW * T,) holds for every window token its index in the map padded to
    multiples of the window (Hp * Wp, row-major) and rolled by -shift, windows in
    :func:`window_partition` order; ``from_windows`` (H * W,) holds for every real token
    its position among the window tokens; ``regions`` (nW, T) the shift region (0..8) of
    every window token, all 0 without shift, -1 at tokens added by padding. Tensor
    operations on the sizes: H, W and ``shift`` may be ints or 0-dim tensors (a trace).
    """
    ws = window_size
    Hp, Wp = padded_size(H, ws), padded_size(W, ws)
    # row / column of the padded map at every position of the map rolled by -shift
    rows = (torch.arange(Hp, device=device) + shift) % Hp
    cols = (torch.arange(Wp, device=device) + shift) % Wp

    def windows(grid: Tensor) -> Tensor:  # (Hp, Wp) in rolled positions -> (nW, T)
        return grid.reshape(-1, ws, Wp // ws, ws).transpose(1, 2).reshape(-1, ws * ws)

    to_windows = windows(rows[:, None] * Wp + cols[None, :]).reshape(-1)
    # rolled position of every real token, then its place among the window tokens
    i = (torch.arange(H, device=device) + (Hp - shift)) % Hp
    j = (torch.arange(W, device=device) + (Wp - shift)) % Wp
    window = (i // ws)[:, None] * (Wp // ws) + (j // ws)[None, :]
    from_windows = (window * (ws * ws) + ((i % ws) * ws)[:, None] + (j % ws)[None, :]).reshape(-1)

    def region(pos: Tensor, size) -> Tensor:  # shift regions 0 | 1 | 2 along one axis
        ids = (pos >= size - ws).to(torch.long) + (pos >= size - shift).to(torch.long)
        if isinstance(shift, Tensor):
            return ids * (shift > 0).to(torch.long)
        return ids if shift else torch.zeros_like(ids)

    ids = region(torch.arange(Hp, device=device), Hp)[:, None] * 3 + region(
        torch.arange(Wp, device=device), Wp)[None, :]
    padded = (rows >= H)[:, None] | (cols >= W)[None, :]
    return to_windows, from_windows, windows(ids.masked_fill(padded, -1))


def _padded(H: int, W: int, window_size: int) -> bool:
    """Whether an H x W map in windows of ``window_size`` is padded."""
    return (padded_size(H, window_size), padded_size(W, window_size)) != (H, W)


@lru_cache(maxsize=64)
def window_regions(H: int, W: int, window_size: int, shift: int):
    """Per window token ids (nW, T) over an H x W map padded to multiples of the
    window and rolled by -shift: the shift region (0..8) of every real token, -1 for
    tokens added by padding (:func:`window_layout`). None when there is neither shift
    nor padding. Cached per size."""
    if shift == 0 and not _padded(H, W, window_size):
        return None
    return window_layout(H, W, window_size, shift, torch.device('cpu'))[2]


@lru_cache(maxsize=64)
def window_gather(H: int, W: int, window_size: int, shift: int,
                  device: torch.device) -> Tuple[Tensor, Tensor]:
    """Token indices that lay an H x W map out as windows and back, in one gather
    each (instead of padding, rolling and partitioning in three copies):
    ``(to_windows, from_windows)`` of :func:`window_layout`, cached per size."""
    return window_layout(H, W, window_size, shift, device)[:2]


@lru_cache(maxsize=64)
def window_mask(H: int, W: int, window_size: int, shift: int, device: torch.device):
    """Additive (nW, T, T) mask of the softmax windows: -inf between tokens of
    different shift regions, and between real and padded tokens. None when nothing
    is masked.

    The official Swin adds -100, whose softmax weight exp(-100) ~ 4e-44 is a
    subnormal float32: it changes no output of a real token (every token's own
    region holds it), but subnormal weights and outputs (those of padded tokens)
    make CPU matrix products several times slower. -inf gives those weights as
    exact zeros; no row is ever fully masked.
    """
    ids = window_regions(H, W, window_size, shift)
    if ids is None:
        return None
    mask = torch.zeros(ids.shape + ids.shape[-1:])
    mask.masked_fill_(ids[:, :, None] != ids[:, None, :], float('-inf'))
    return mask.to(device)


@lru_cache(maxsize=64)
def window_padding(H: int, W: int, window_size: int, shift: int, device: torch.device):
    """(nW, T) bool, True at tokens added by padding; None without padding. The
    linear windows ignore the shift regions, as the official code does."""
    if not _padded(H, W, window_size):
        return None
    return (window_regions(H, W, window_size, shift) < 0).to(device)


def captured_window_layout(H, W, window_size: int, shifted: bool, device: torch.device):
    """:func:`window_layout` for a graph capture (a jit trace passes H and W as 0-dim
    tensors), with the shift decided by the graph (:func:`window_shift`), so that one
    captured graph serves any map size. Never cached.

    Returns ``(to_windows, from_windows, regions)`` of :func:`window_layout` (regions
    all 0 without shift; -1 at padding), never None.
    """
    return window_layout(H, W, window_size, window_shift((H, W), window_size, shifted), device)
