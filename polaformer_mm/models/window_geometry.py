"""Window geometry of the Swin stages: partition and reverse, the shift, the padding and
the masks, for an H x W map of tokens in windows of ``window_size`` x ``window_size``.

The layout is the official Swin one: the map is zero-padded at the bottom and right to
multiples of the window (:func:`padded_size`), shifted blocks roll it by ``-shift``
(:func:`window_shift`), and windows are taken in row-major order, tokens row-major within
each (:func:`window_partition`, :func:`window_reverse`). :func:`window_gather` gives that
layout as one gather each way; :func:`window_regions` labels every window token with its
shift region (-1 for padding), from which :func:`window_mask` (softmax windows) and
:func:`window_padding` (linear windows) are made. :func:`captured_window_layout` gives the
same for a graph capture, as tensor operations on the sizes. Used by
:class:`~polaformer_mm.models.backbones.pola_swin.SwinBlock`, the tools and the tests.
"""
from functools import lru_cache
from typing import Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    'window_partition', 'window_reverse', 'padded_size', 'window_shift', 'window_regions',
    'window_gather', 'window_mask', 'window_padding', 'captured_window_layout'
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


def window_shift(hw_shape: Sequence[int], window_size: int, shifted: bool) -> int:
    """Half a window on shifted blocks, when the map is larger than one window along
    both sides; 0 otherwise (a map no larger than the window along its shorter side
    is one window row, never shifted: the official rule)."""
    return window_size // 2 if shifted and min(hw_shape) > window_size else 0


@lru_cache(maxsize=64)
def window_regions(H: int, W: int, window_size: int, shift: int):
    """Per window token ids (nW, T) over an H x W map padded to multiples of the
    window and rolled by -shift: the shift region (0..8) of every real token, -1 for
    tokens added by padding. None when there is neither shift nor padding."""
    Hp, Wp = padded_size(H, window_size), padded_size(W, window_size)
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
def window_gather(H: int, W: int, window_size: int, shift: int,
                  device: torch.device) -> Tuple[Tensor, Tensor]:
    """Token indices that lay an H x W map out as windows and back, in one gather
    each (instead of padding, rolling and partitioning in three copies):
    ``to_windows`` (nW * T,) holds for every window token its index in the map
    padded to multiples of the window (Hp * Wp, row-major) and rolled by -shift,
    windows in :func:`window_partition` order; ``from_windows`` (H * W,) holds for
    every real token its position among the window tokens."""
    Hp, Wp = padded_size(H, window_size), padded_size(W, window_size)
    # built with numpy: no tensor operations for a trace (get_flops) to record
    flat = np.arange(Hp * Wp).reshape(Hp, Wp)
    if shift:
        flat = np.roll(flat, (-shift, -shift), axis=(0, 1))
    rows, cols = Hp // window_size, Wp // window_size
    to_windows = flat.reshape(rows, window_size, cols, window_size).transpose(0, 2, 1, 3)
    to_windows = to_windows.reshape(-1)
    position = np.empty_like(to_windows)
    position[to_windows] = np.arange(to_windows.size)
    real = (np.arange(H)[:, None] * Wp + np.arange(W)[None, :]).reshape(-1)
    return (torch.from_numpy(to_windows).to(device), torch.from_numpy(position[real]).to(device))


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
    if (padded_size(H, window_size), padded_size(W, window_size)) == (H, W):
        return None
    return (window_regions(H, W, window_size, shift) < 0).to(device)


def captured_window_layout(H, W, window_size: int, shifted: bool, device: torch.device):
    """What :func:`window_gather` and :func:`window_regions` give, as tensor
    operations on the sizes for a graph capture (a jit trace passes H and W as 0-dim
    tensors): the same indices, with the shift decided by the graph, so that one
    captured graph serves any map size. Never cached.

    Returns ``(to_windows, from_windows, regions)``: the gather indices of
    :func:`window_gather` and the region ids (nW, T) of :func:`window_regions`
    (all 0 without shift; -1 at padding), never None.
    """
    ws = window_size
    Hp, Wp = padded_size(H, ws), padded_size(W, ws)
    if not shifted:
        shift = 0
    elif isinstance(H, Tensor):
        shift = (torch.minimum(H, W) > ws).long() * (ws // 2)
    else:
        shift = window_shift((H, W), ws, shifted)
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
        ids = (pos >= size - ws).long() + (pos >= size - shift).long()
        if isinstance(shift, Tensor):
            return ids * (shift > 0).long()
        return ids if shift else torch.zeros_like(ids)

    ids = region(torch.arange(Hp, device=device), Hp)[:, None] * 3 + region(
        torch.arange(Wp, device=device), Wp)[None, :]
    padded = (rows >= H)[:, None] | (cols >= W)[None, :]
    return to_windows, from_windows, windows(ids.masked_fill(padded, -1))
