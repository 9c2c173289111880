"""Attention maps, entropies and learned exponents of the Pola blocks of a config on an image.

:func:`analyse_attention` is what ``tools/analysis_tools/visualize_attention.py`` runs
(docs/user_guides/analysis_tools.md): it builds the config's model
(:mod:`~polaformer_mm.analysis.loading`; without a checkpoint the backbone keeps its seeded
random initialisation, said loudly, on every figure and in the JSON), puts the image through
the config's test pipeline, records every Pola ('L') attention module in one forward pass
(:mod:`~polaformer_mm.analysis.attention_sites`) and, for every analysed block, draws the
weights of the query points over the keys of both streams (beside the softmax baseline's
block at the same stage and depth, when a baseline config is given) and measures:

* per block and head, the mean entropy of the attention rows of both streams over
  ``num_queries`` random query tokens on the image, with the learned exponents and with
  p = 1 (same queries, keys and scale; only the exponent changed), and the baseline's on the
  same positions. An empirical measurement on one image with the given weights: the paper's
  Theorem 1 claims the power function lowers the entropy, which does not hold in general
  (docs/advanced_guides/method.md, section 5);
* per stage, the range and a histogram of the learned exponents
  ``p = 1 + alpha * sigmoid(power)``;
* per query point, each stream's largest weight and where it lies.

Query points are pixel coordinates (column, row) of the original image, mapped through the
pipeline's resizing (and a ``CenterCrop``); the default is its centre and the points at
(1/4, 1/3) and (3/4, 2/3) of its width and height.
"""
import json
import math
import os
import os.path as osp
import sys
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import mmcv
import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config

from ..engine.entry import load_config
from ..utils.checkpoint_io import require_checkpoint
from .attention_figures import draw_block, draw_entropy, draw_exponents
from .attention_sites import (STREAMS, PolaSite, Site, collect_pola_sites, collect_softmax_sites,
                              point_cells, sample_cells)
from .loading import Prepared, build_model, prepare_image

__all__ = ['AttentionOptions', 'analyse_attention', 'default_points']

RANDOM_WEIGHTS_WARNING = (
    'No --checkpoint given: the backbone keeps its RANDOM initialisation, so the '
    'attention maps, entropies and exponents describe an untrained model. Pass '
    '--checkpoint CKPT for a trained one.')
RANDOM_BASELINE_WARNING = ('No --baseline-checkpoint given: the baseline backbone keeps its RANDOM '
                           'initialisation.')


@dataclass(frozen=True)
class AttentionOptions:
    """What :func:`analyse_attention` analyses, and how (the tool's command line)."""
    config: str  #: mmdet / mmseg / mmpretrain config with a PolaPVT or PolaSwin backbone
    image: str  #: image file
    out_dir: str  #: output folder
    checkpoint: Optional[str] = None  #: whole-model, converted or official checkpoint
    points: Optional[Sequence[Tuple[float, float]]] = None  #: (x, y) in original pixels
    baseline_config: Optional[str] = None  #: softmax baseline config drawn beside
    baseline_checkpoint: Optional[str] = None  #: its checkpoint
    device: Optional[str] = None  #: 'cpu' or 'cuda'; default cuda when available
    num_queries: int = 256  #: random query tokens per block for the entropies
    seed: int = 0  #: seed of the query sampling and of a random initialisation
    stages: Optional[Sequence[int]] = None  #: analyse the blocks of these stages only
    per_head: bool = False  #: one panel per head instead of the mean over heads
    dpi: int = 100  #: resolution of the PNGs


def _loud_warning(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=3)
    print(f'{"!" * 79}\n{message}\n{"!" * 79}', file=sys.stderr)


def _peak(weights: np.ndarray, site: Site) -> dict:
    """Largest weight of each head's map and the input-pixel centre of its key cell."""
    heads = weights.reshape(weights.shape[0], -1)
    flat = heads.argmax(-1)
    rows, cols = np.unravel_index(flat, weights.shape[1:])
    return dict(
        max_weight=heads.max(-1).tolist(),
        argmax_xy=[[(c + 0.5) * site.key_cell, (r + 0.5) * site.key_cell]
                   for r, c in zip(rows, cols)])


def default_points(ori_hw: Sequence[int]) -> List[Tuple[float, float]]:
    """The query points when none are given: the centre of an image of ``ori_hw``
    (height, width) and the points at (1/4, 1/3) and (3/4, 2/3) of its width and height."""
    h, w = ori_hw
    return [(w / 2, h / 2), (w / 4, h / 3), (3 * w / 4, 2 * h / 3)]


def _json_safe(obj):
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return None if not math.isfinite(obj) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return _json_safe(obj.tolist())
    return obj


def _mean_over_queries(values: np.ndarray) -> List[Optional[float]]:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)  # all-NaN heads stay NaN
        return np.nanmean(values, axis=0).tolist()


def _check_inputs(opts: AttentionOptions) -> Tuple[List[Tuple[float, float]], str]:
    """The query points (the defaults when none are given) and the device, after checking
    that the files exist, the image reads and the points lie on it."""
    for path, what in ((opts.image, 'image'), (opts.config, 'config'), (opts.baseline_config,
                                                                        'baseline config')):
        if path is not None and not osp.isfile(path):
            raise FileNotFoundError(f'{what} file not found: {path}')
    points = None if opts.points is None else [(float(x), float(y)) for x, y in opts.points]
    image = mmcv.imread(opts.image)
    if image is None:
        raise ValueError(f'cannot read an image from {opts.image}')
    ori_h, ori_w = image.shape[:2]
    points = points or default_points((ori_h, ori_w))
    for x, y in points:
        if not (0 <= x < ori_w and 0 <= y < ori_h):
            raise ValueError(f'--points {x:g},{y:g} lies outside the image '
                             f'({ori_w} x {ori_h} pixels)')
    device = opts.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if device == 'cuda' and not torch.cuda.is_available():
        raise RuntimeError('--device cuda: torch sees no CUDA device (use --device cpu)')
    return points, device


def _load_configs(opts: AttentionOptions) -> Tuple[Config, Optional[Config], str]:
    """The config, the baseline config (or None) and the note on the weights every
    figure carries; the checkpoint must exist, and random weights are warned of loudly."""
    cfg = load_config(opts.config)
    base_cfg = load_config(opts.baseline_config) if opts.baseline_config else None
    if opts.checkpoint is not None:
        require_checkpoint(opts.checkpoint, '--checkpoint')
    else:
        _loud_warning(RANDOM_WEIGHTS_WARNING)
    if base_cfg is not None and opts.baseline_checkpoint is None:
        _loud_warning(RANDOM_BASELINE_WARNING)
    random_note = ('RANDOM INITIALISATION (no checkpoint): an untrained model'
                   if opts.checkpoint is None else f'weights: {osp.basename(opts.checkpoint)}')
    return cfg, base_cfg, random_note


def _input_points(prepared: Prepared, points: Sequence[Tuple[float, float]]) -> np.ndarray:
    """The query points in the pixels of the model's input image (clipped to it)."""
    ax_, bx, ay, by = prepared.to_input
    points_input = np.array([[ax_ * x + bx, ay * y + by] for x, y in points])
    return np.clip(points_input, 0, np.array(prepared.image.shape[:2][::-1]) - 1)


def _pola_sites(opts: AttentionOptions, model: nn.Module, prepared: Prepared) -> List[PolaSite]:
    """The Pola blocks to analyse (those of ``--stages``); an error when there is none."""
    sites = collect_pola_sites(model.backbone, prepared.inputs)
    if not sites:
        raise ValueError(f'{opts.config}: backbone {type(model.backbone).__name__} has no '
                         "Pola linear-attention ('L') block")
    if opts.stages is not None:
        sites = [s for s in sites if s.stage in opts.stages]
        if not sites:
            raise ValueError(f'--stages {opts.stages}: no Pola block in these stages')
    return sites


def _baseline_sites(opts: AttentionOptions, base_cfg: Optional[Config], device: str,
                    prepared: Prepared) -> Dict[Tuple[int, int], Site]:
    """The softmax blocks of the baseline (none without one), by (stage, block)."""
    baseline_sites = {}
    if base_cfg is not None:
        base_model = build_model(
            base_cfg, opts.baseline_checkpoint, device, opts.seed, what='--baseline-checkpoint')
        for site in collect_softmax_sites(base_model.backbone, prepared.inputs):
            baseline_sites[(site.stage, site.block)] = site
        del base_model
    return baseline_sites


def _exponent_info(p: np.ndarray) -> dict:
    return dict(per_head=p.tolist(), min=float(p.min()), mean=float(p.mean()), max=float(p.max()))


def _entropy_info(learned: dict, p_one: dict, num_queries: int) -> dict:
    """The mean row entropies of both streams with the learned exponents and with p = 1."""
    return dict(
        num_queries=num_queries,
        log_n=float(learned['log_n'].mean()),
        nan_rows={s: int(np.isnan(learned[s]).sum() + np.isnan(p_one[s]).sum())
                  for s in STREAMS},
        **{
            s: dict(learned=_mean_over_queries(learned[s]), p1=_mean_over_queries(p_one[s]))
            for s in STREAMS
        })


def _baseline_info(base: Site, site: PolaSite, queries: np.ndarray, points_input: np.ndarray,
                   base_maps: dict) -> dict:
    """The baseline block's layout, entropies at the Pola block's query positions and
    peaks at the query points."""
    centres = (queries[:, ::-1] + 0.5) * site.stride  # (x, y) pixels
    base_queries = point_cells(centres, base)
    ent = base.entropies(base_queries)
    return dict(
        name=base.name,
        **base.describe(),
        entropy=dict(
            num_queries=len(base_queries),
            log_n=float(ent['log_n'].mean()),
            softmax=_mean_over_queries(ent['softmax'])),
        points=[
            dict(
                query_cell=c,
                **_peak(base_maps['softmax'][i], base),
                off_map_weight=base_maps['softmax_off_map'][i].tolist())
            for i, c in enumerate(point_cells(points_input, base).tolist())
        ])


def _analyse_block(opts: AttentionOptions, site: PolaSite, base: Optional[Site], prepared: Prepared,
                   points: Sequence[Tuple[float, float]], points_input: np.ndarray,
                   random_note: str) -> Tuple[str, dict]:
    """Draw one Pola block's figure (with its baseline block ``base``, if any) and
    measure it; returns the figure's path and the block's numbers for the JSON."""
    # the same stage and depth; grids may differ by a token where one backbone
    # pads and the other drops a remainder: points map through pixels
    cells = point_cells(points_input, site)
    maps = site.maps(cells)
    base_maps = base.maps(point_cells(points_input, base)) if base else None
    png = osp.join(opts.out_dir, f'attention_s{site.stage}_b{site.block}.png')
    draw_block(png, site, base, prepared.image, points_input, points, maps, base_maps,
               opts.per_head, random_note, opts.dpi)

    queries = sample_cells(site, prepared.image.shape[:2], opts.num_queries, opts.seed)
    p = site.exponents()
    info = dict(
        name=site.name,
        stage=site.stage,
        block=site.block,
        **site.describe(),
        head_dims=int(p.shape[1]),
        figure=osp.basename(png),
        exponents=_exponent_info(p))
    info['entropy'] = _entropy_info(
        site.entropies(queries), site.entropies(queries, exponent_one=True), len(queries))
    info['points'] = [
        dict(
            input_xy=points_input[i].tolist(),
            query_cell=cells[i].tolist(),
            **{
                s: dict(**_peak(maps[s][i], site), off_map_weight=maps[f'{s}_off_map'][i].tolist())
                for s in STREAMS
            }) for i in range(len(points))
    ]
    if base is not None:
        info['baseline'] = _baseline_info(base, site, queries, points_input, base_maps)
    site.release()
    return png, info


def _stage_summaries(sites: Sequence[PolaSite], blocks: Sequence[dict]) -> List[dict]:
    """Per stage, the learned exponents of its analysed blocks: range and histogram."""
    stages = []
    for stage in sorted({s.stage for s in sites}):
        values = np.concatenate(
            [np.ravel(b['exponents']['per_head']) for b in blocks if b['stage'] == stage])
        alpha = next(s.alpha for s in sites if s.stage == stage)
        counts, edges = np.histogram(values, bins=40, range=(1, 1 + alpha))
        stages.append(
            dict(
                stage=stage,
                alpha=alpha,
                count=int(values.size),
                min=float(values.min()),
                mean=float(values.mean()),
                max=float(values.max()),
                histogram=dict(bin_edges=edges.tolist(), counts=counts.tolist())))
    return stages


def _summary(opts: AttentionOptions, prepared: Prepared, base_cfg: Optional[Config],
             points: Sequence[Tuple[float, float]], points_input: np.ndarray, blocks: List[dict],
             stages: List[dict]) -> dict:
    """The contents of ``attention.json``."""
    return dict(
        config=opts.config,
        checkpoint=opts.checkpoint,
        random_weights=opts.checkpoint is None,
        image=opts.image,
        image_shape=list(prepared.ori_hw),
        input_image_shape=list(prepared.image.shape[:2]),
        input_shape=list(prepared.inputs.shape[-2:]),
        baseline_config=opts.baseline_config,
        baseline_checkpoint=opts.baseline_checkpoint,
        baseline_random_weights=(base_cfg is not None and opts.baseline_checkpoint is None),
        points=[
            dict(image_xy=list(pt), input_xy=pi.tolist()) for pt, pi in zip(points, points_input)
        ],
        seed=opts.seed,
        num_queries=opts.num_queries,
        entropy_note=('mean over sampled query tokens of each row\'s entropy (nats, the '
                      'row renormalised to sum to 1); log_n is the mean log of the number '
                      'of keys a row ranges over. Measured on this image with these '
                      'weights; docs/advanced_guides/method.md section 5 explains why the '
                      'power function need not lower it.'),
        blocks=blocks,
        stages=stages)


def analyse_attention(opts: AttentionOptions) -> Dict[str, object]:
    """Run the analysis; returns the paths it wrote (``json``, ``entropy``,
    ``exponents`` and ``blocks``: one PNG per analysed block)."""
    points, device = _check_inputs(opts)
    cfg, base_cfg, random_note = _load_configs(opts)
    model = build_model(cfg, opts.checkpoint, device, opts.seed)
    prepared = prepare_image(cfg, model, opts.image)
    points_input = _input_points(prepared, points)
    sites = _pola_sites(opts, model, prepared)
    baseline_sites = _baseline_sites(opts, base_cfg, device, prepared)

    os.makedirs(opts.out_dir, exist_ok=True)
    written = dict(blocks=[])
    blocks = []
    for site in sites:
        png, info = _analyse_block(opts, site, baseline_sites.get((site.stage, site.block)),
                                   prepared, points, points_input, random_note)
        written['blocks'].append(png)
        blocks.append(info)
    stages = _stage_summaries(sites, blocks)

    written['entropy'] = osp.join(opts.out_dir, 'entropy.png')
    draw_entropy(written['entropy'], blocks, random_note, opts.dpi)
    written['exponents'] = osp.join(opts.out_dir, 'exponents.png')
    draw_exponents(written['exponents'], stages, max(s.alpha for s in sites), random_note, opts.dpi)
    summary = _summary(opts, prepared, base_cfg, points, points_input, blocks, stages)
    written['json'] = osp.join(opts.out_dir, 'attention.json')
    with open(written['json'], 'w') as f:
        json.dump(_json_safe(summary), f, indent=1)
    print(f'wrote {len(written["blocks"])} block figures, {written["entropy"]}, '
          f'{written["exponents"]} and {written["json"]}')
    return written
