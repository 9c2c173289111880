#!/usr/bin/env python
"""Attention maps, entropies and learned exponents of the Pola blocks of a config.

    python tools/analysis_tools/visualize_attention.py CONFIG IMAGE --out-dir DIR
        [--checkpoint CKPT] [--points x,y ...]
        [--baseline-config CFG [--baseline-checkpoint CKPT]]
        [--device cpu|cuda] [--num-queries 256] [--seed 0] [--stages I ...]
        [--per-head] [--dpi 100]

CONFIG is a detection (mmdet), segmentation (mmseg) or classification (mmpretrain) config
whose backbone is ``PolaPVT``, ``PolaSwin``, ``PolaPVTv2`` or ``PolaViT`` (its patch
queries; the class token's key is one key off the grid); the model is built through the registry of
the config's ``default_scope``. ``--checkpoint`` (a whole-model checkpoint as
``tools/train.py`` writes it, a converted backbone file, or an official PolaFormer
checkpoint) is read weights-only (``polaformer_mm.utils.checkpoint_io``) and must hold
every backbone parameter; the rest of the model does not affect the backbone's attention.
Without it the backbone keeps its random initialisation (seeded by ``--seed``): the tool
says so loudly, on every figure and in the JSON.

The image goes through the config's test pipeline (annotation loading dropped) and the
model's data preprocessor, as at test time. One no-grad forward pass of the backbone
records the inputs of every Pola ('L') attention module, and
``PolaLinearAttention.project`` turns them into the queries and keys the module uses. No
N x n matrix is formed: the weights of the queries that are needed come from
``polaformer_mm.ops.pola_attention_weights`` (float64), O(n) per query.

Query points (``--points x,y``) are pixel coordinates (column, row) of the original
image; the default is its centre and the points at (1/4, 1/3) and (3/4, 2/3) of its width
and height. They are mapped through the pipeline's resizing (and a ``CenterCrop``), and
every figure shows the image as the model sees it.

Writes into ``--out-dir``:

* ``attention_s<stage>_b<block>.png`` for every 'L' block: for every query point (rows)
  the weights over the keys of the same-signed and of the opposite-signed stream (mean
  over heads, or one panel per head with ``--per-head``) and, with ``--baseline-config``,
  the softmax attention of the baseline's block at the same stage and depth, for the
  same point: PVT spatial-reduction attention over its reduced keys, Swin window
  attention over the query's window (its shift mask included). Each key's weight covers
  the pixels of its token (no smoothing); each panel is scaled to its own maximum.
  Windowed Pola-Swin blocks attend within the query's window of ``linear_window_size``
  tokens (odd blocks shifted by half a window, without a shift mask, so a window at the
  far edge wraps around to the near one; tokens added by padding take no part); the
  window is outlined.
* ``entropy.png``: per block and head, the mean entropy of the attention rows of both
  streams over ``--num-queries`` random query tokens on the image, with the learned
  exponents and with p = 1 (same queries, keys and scale; only the exponent changed), as
  a fraction of log n (n: the keys the row ranges over), and the softmax baseline's on
  the same positions. An empirical measurement on one image with the given weights: the
  paper's Theorem 1 claims the power function lowers the entropy, which does not hold in
  general (docs/advanced_guides/method.md, section 5).
* ``exponents.png``: per stage, a histogram of the learned exponents
  ``p = 1 + alpha * sigmoid(power)`` over all heads and channels of its 'L' blocks.
* ``attention.json``: the numbers: per block its layout, exponents, entropies (nats,
  with log n) and, per query point, each stream's largest weight and where it lies.

The analysis is :func:`polaformer_mm.analysis.attention_maps.analyse_attention`; the
attention sites it records are in :mod:`polaformer_mm.analysis.attention_sites`.
"""
import argparse
import os.path as osp
import sys
from typing import List, Optional, Sequence, Tuple

import matplotlib

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from polaformer_mm.analysis.attention_maps import AttentionOptions, analyse_attention  # noqa: E402
from polaformer_mm.engine.entry import run_tool  # noqa: E402


def parse_points(values: Optional[Sequence[str]]) -> Optional[List[Tuple[float, float]]]:
    """``['x,y', ...]`` -> ``[(x, y), ...]``; None stays None."""
    if values is None:
        return None
    points = []
    for value in values:
        parts = value.split(',')
        try:
            if len(parts) != 2:
                raise ValueError
            points.append((float(parts[0]), float(parts[1])))
        except ValueError:
            raise ValueError(f'--points {value!r}: expected x,y pixel coordinates, '
                             'e.g. 120,80') from None
    return points


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description='Attention maps, entropies and exponents of the Pola blocks of a '
        'config on one image')
    p.add_argument(
        'config', help='mmdet / mmseg / mmpretrain config with a PolaPVT or '
        'PolaSwin backbone')
    p.add_argument('image', help='image file')
    p.add_argument('--out-dir', required=True, help='output folder')
    p.add_argument(
        '--checkpoint',
        help='whole-model, converted or official checkpoint; '
        'without it the weights are random (with a warning)')
    p.add_argument(
        '--points',
        nargs='+',
        metavar='X,Y',
        help='query points in pixels of the original image (default: the '
        'centre and two points on the diagonal)')
    p.add_argument(
        '--baseline-config',
        help='softmax baseline config (mmdet '
        'PyramidVisionTransformer / SwinTransformer backbone) drawn beside')
    p.add_argument('--baseline-checkpoint', help='checkpoint of the baseline')
    p.add_argument(
        '--device',
        choices=['cpu', 'cuda'],
        default=None,
        help='default: cuda when available, else cpu')
    p.add_argument(
        '--num-queries',
        type=int,
        default=256,
        help='random query tokens per block for the entropies (default 256)')
    p.add_argument(
        '--seed',
        type=int,
        default=0,
        help='seed of the query sampling and of a random initialisation')
    p.add_argument(
        '--stages',
        type=int,
        nargs='+',
        help='analyse the blocks of these stages only (default: all)')
    p.add_argument(
        '--per-head', action='store_true', help='one panel per head instead of the mean over heads')
    p.add_argument('--dpi', type=int, default=100, help='resolution of the PNGs')
    args = p.parse_args(argv)
    if args.baseline_checkpoint and not args.baseline_config:
        p.error('--baseline-checkpoint needs --baseline-config')
    if args.num_queries < 1:
        p.error('--num-queries must be >= 1')
    return args


def main(argv: Optional[List[str]] = None) -> dict:
    """Run the analysis; returns the paths it wrote (``json``, ``entropy``,
    ``exponents`` and ``blocks``: one PNG per analysed block)."""
    args = parse_args(argv)
    points = parse_points(args.points)
    matplotlib.use('Agg')
    return analyse_attention(AttentionOptions(**dict(vars(args), points=points)))


if __name__ == '__main__':
    # a named problem of the input: its message and no traceback
    run_tool(main, 'visualize_attention.py')
