"""Figures of the attention analysis (:mod:`polaformer_mm.analysis.attention_maps`).

* :func:`draw_block`: for every query point (rows) the weights over the keys of the Pola
  streams (and the softmax baseline's), each key's weight covering the pixels of its token,
  each panel scaled to its own maximum; windows are outlined.
* :func:`draw_entropy`: per block and head, the mean row entropy as a fraction of log n.
* :func:`draw_exponents`: per stage, a histogram of the learned exponents.

The functions use :mod:`matplotlib.pyplot` with whatever backend is active (the command
line tool selects ``Agg``) and close their figures.
"""
from typing import List, Optional, Sequence, Tuple

import matplotlib.pyplot as plt
import numpy as np

from .attention_sites import STREAMS, PolaSite, Site

__all__ = ['STREAM_TITLES', 'draw_block', 'draw_entropy', 'draw_exponents']

STREAM_TITLES = {
    'same_signed': 'same-signed',
    'opposite_signed': 'opposite-signed',
    'softmax': 'softmax baseline'
}


def _render(grid: np.ndarray, cell: int, image_hw: Sequence[int]) -> np.ndarray:
    """A key-grid map as an image-sized array: each cell covers cell x cell pixels."""
    up = np.repeat(np.repeat(grid, cell, axis=0), cell, axis=1)
    out = np.zeros(tuple(image_hw), dtype=up.dtype)
    h, w = min(up.shape[0], image_hw[0]), min(up.shape[1], image_hw[1])
    out[:h, :w] = up[:h, :w]
    return out


def _overlay(ax, image: np.ndarray, heat: np.ndarray, cmap) -> float:
    """The image in grey, the weights in colour over it (0 to the panel's maximum);
    downsampled panels average the weights of the pixels they merge."""
    ax.imshow(
        image @ np.array([0.299, 0.587, 0.114]),
        cmap='gray',
        vmin=0,
        vmax=255,
        interpolation='antialiased')
    peak = float(heat.max())
    ax.imshow(
        heat,
        cmap=cmap,
        vmin=0,
        vmax=peak if peak > 0 else 1,
        alpha=0.65,
        interpolation='antialiased')
    return peak


def draw_block(path: str, site: PolaSite, baseline: Optional[Site], image: np.ndarray,
               points_input: np.ndarray, points: Sequence[Tuple[float, float]], maps: dict,
               base_maps: Optional[dict], per_head: bool, random_note: str, dpi: int) -> None:
    """One row per point: both Pola streams (and the baseline's softmax) on the image."""
    panels = []  # (title, source site, maps, stream, head or None)
    for stream in site.streams:
        heads = range(site.num_heads) if per_head else [None]
        panels += [(site, maps, stream, h) for h in heads]
    if baseline is not None:
        heads = range(baseline.num_heads) if per_head else [None]
        panels += [(baseline, base_maps, 'softmax', h) for h in heads]
    rows, cols = len(points_input), len(panels)
    aspect = image.shape[0] / image.shape[1]
    fig, axes = plt.subplots(
        rows, cols, figsize=(2.6 * cols, 2.6 * aspect * rows + 0.9), squeeze=False)
    cmap = plt.get_cmap('inferno')
    for i, (x, y) in enumerate(points_input):
        for j, (src, src_maps, stream, head) in enumerate(panels):
            ax = axes[i, j]
            weights = src_maps[stream][i]
            grid = weights.mean(0) if head is None else weights[head]
            heat = _render(grid, src.key_cell, image.shape[:2])
            peak = _overlay(ax, image, heat, cmap)
            if src.window is not None:
                keys = _render(src_maps['keys'][i].astype(float), src.key_cell, image.shape[:2])
                if 0 < keys.sum() < keys.size:
                    ax.contour(keys, levels=[0.5], colors='cyan', linewidths=0.8)
            ax.plot([x], [y], marker='+', color='lime', markersize=11, mew=2)
            ax.text(
                0.02,
                0.02,
                f'max {peak:.3g}',
                transform=ax.transAxes,
                fontsize=6,
                color='white',
                va='bottom',
                bbox=dict(facecolor='black', alpha=0.5, pad=1, lw=0))
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                if head is not None:
                    which = f'head {head}'
                else:
                    which = ('1 head' if src.num_heads == 1 else f'mean of {src.num_heads} heads')
                ax.set_title(f'{STREAM_TITLES[stream]}\n{which}', fontsize=8)
            if j == 0:
                ax.set_ylabel('point ({:.0f}, {:.0f})'.format(*points[i]), fontsize=8)
    layout = (f'window {site.window[0]}, shift {site.window[1]}'
              if site.window else f'{site.key_hw[0]}x{site.key_hw[1]} keys')
    title = (f'{site.name}: stage {site.stage}, block {site.block}, {layout}'
             f'\n{random_note}')
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def draw_entropy(path: str, blocks: List[dict], random_note: str, dpi: int) -> None:
    """Per block, the mean row entropy of both streams (learned exponents, p = 1, the
    baseline's softmax) as a fraction of log n; dots: heads."""
    labels = [f's{b["stage"]}b{b["block"]}' for b in blocks]
    x = np.arange(len(blocks))
    fig, axes = plt.subplots(2, 1, figsize=(max(6., 0.9 * len(blocks) + 2) + 2, 6), sharex=True)
    variants = [('learned', 'learned p', 'tab:red'), ('p1', 'p = 1', 'tab:blue')]
    has_base = any('baseline' in b for b in blocks)
    width = 0.8 / (len(variants) + has_base)
    for ax, stream in zip(axes, STREAMS):
        for v, (key, label, color) in enumerate(variants):
            values = [np.array(b['entropy'][stream][key]) / b['entropy']['log_n'] for b in blocks]
            ax.bar(
                x + (v - 0.5) * width, [np.nanmean(val) for val in values],
                width,
                color=color,
                alpha=0.6,
                label=f'{label} (mean of heads)')
            for xi, val in zip(x, values):
                ax.plot(
                    np.full(len(val), xi + (v - 0.5) * width), val, '.', color=color, markersize=4)
        if has_base:
            pos = [
                (xi,
                 np.array(b['baseline']['entropy']['softmax']) / b['baseline']['entropy']['log_n'])
                for xi, b in zip(x, blocks) if 'baseline' in b
            ]
            ax.bar([p[0] + 1.5 * width for p in pos], [np.nanmean(p[1]) for p in pos],
                   width,
                   color='tab:gray',
                   alpha=0.6,
                   label='softmax baseline')
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(f'{STREAM_TITLES[stream]}\nentropy / log n')
        ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.005, 1.0))
    axes[-1].set_xticks(x)
    axes[-1].set_xticklabels(labels, rotation=90 if len(blocks) > 16 else 0)
    fig.suptitle(
        'Mean attention entropy over sampled queries (dots: heads); an '
        'empirical measurement, see docs/advanced_guides/method.md section 5\n' + random_note,
        fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def draw_exponents(path: str, stages: List[dict], alpha: float, random_note: str, dpi: int) -> None:
    """Per stage, a histogram of the learned exponents over ``[1, 1 + alpha]``."""
    fig, axes = plt.subplots(1, len(stages), figsize=(3.2 * len(stages), 3), squeeze=False)
    for ax, stage in zip(axes[0], stages):
        hist = stage['histogram']
        edges = np.array(hist['bin_edges'])
        ax.bar(edges[:-1], hist['counts'], np.diff(edges), align='edge', color='tab:purple')
        ax.set_xlim(1, 1 + alpha)
        ax.set_title(
            f'stage {stage["stage"]}: {stage["count"]} exponents\n'
            f'min {stage["min"]:.3f}  mean {stage["mean"]:.3f}  '
            f'max {stage["max"]:.3f}',
            fontsize=8)
        ax.set_xlabel('p = 1 + alpha * sigmoid(power)')
    axes[0, 0].set_ylabel('channels (all heads, all L blocks)')
    fig.suptitle('Learned exponents per stage\n' + random_note, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
