#!/usr/bin/env python
"""Attention maps, entropies and learned exponents of the Pola blocks of a config.

    python tools/analysis_tools/visualize_attention.py CONFIG IMAGE --out-dir DIR
        [--checkpoint CKPT] [--points x,y ...]
        [--baseline-config CFG [--baseline-checkpoint CKPT]]
        [--device cpu|cuda] [--num-queries 256] [--seed 0] [--stages I ...]
        [--per-head] [--dpi 100]

CONFIG is a detection (mmdet), segmentation (mmseg) or classification (mmpretrain) config
whose backbone is ``PolaPVT`` or ``PolaSwin``; the model is built through the registry of
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
"""
import argparse
import copy
import importlib
import json
import math
import os
import os.path as osp
import re
import sys
import warnings
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

# polaformer_mm before anything that imports torchvision: keep this order
# isort: off
import polaformer_mm  # noqa: E402,F401  (registers the backbones; before torchvision)
import matplotlib  # noqa: E402

matplotlib.use('Agg')
import mmcv  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from polaformer_mm.engine.entry import load_config, task_of  # noqa: E402
from polaformer_mm.models.attention import PolaLinearAttention  # noqa: E402
from polaformer_mm.models.backbones.pola_swin import SwinBlock as PolaSwinBlock  # noqa: E402
from polaformer_mm.models.window_geometry import window_shift  # noqa: E402
from polaformer_mm.models.official_weights import convert_official_state_dict  # noqa: E402
from polaformer_mm.models.official_weights import detect_official_family  # noqa: E402
from polaformer_mm.models.official_weights import extract_state_dict  # noqa: E402
from polaformer_mm.ops import attention_entropy, pola_attention_weights  # noqa: E402
from polaformer_mm.ops import pola_exponent  # noqa: E402
from polaformer_mm.utils.checkpoint_io import load_checkpoint, require_checkpoint  # noqa: E402
# isort: on

RANDOM_WEIGHTS_WARNING = (
    'No --checkpoint given: the backbone keeps its RANDOM initialisation, so the '
    'attention maps, entropies and exponents describe an untrained model. Pass '
    '--checkpoint CKPT for a trained one.')
RANDOM_BASELINE_WARNING = ('No --baseline-checkpoint given: the baseline backbone keeps its RANDOM '
                           'initialisation.')
STREAMS = ('same_signed', 'opposite_signed')
STREAM_TITLES = {
    'same_signed': 'same-signed',
    'opposite_signed': 'opposite-signed',
    'softmax': 'softmax baseline'
}
QUERY_CHUNK = 64  # query rows per weight computation (memory: chunk x heads x keys)


# --------------------------------------------------------------------------------------
# command line
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


def _loud_warning(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=3)
    print(f'{"!" * 79}\n{message}\n{"!" * 79}', file=sys.stderr)


# --------------------------------------------------------------------------------------
# model, weights and the image
def _registry(scope: str, name: str):
    return getattr(importlib.import_module(f'{scope}.registry'), name)


def load_weights(model: nn.Module, path: str, what: str = 'checkpoint') -> dict:
    """Load ``path`` (weights-only) into ``model``; every backbone parameter must be in it.

    Accepts whole-model checkpoints (``state_dict`` with ``backbone.*`` keys, an optional
    ``module.`` prefix), bare backbone state dicts and official PolaFormer checkpoints
    (converted on the fly). Returns the keys that stayed as they were and the unused ones.
    """
    obj = load_checkpoint(path, what=what)  # weights-only; mmengine checkpoints too
    state = extract_state_dict(obj, source=path)
    state = {re.sub(r'^module\.', '', k): v for k, v in state.items()}
    if detect_official_family(state) is not None:
        state = convert_official_state_dict(state, family=getattr(model.backbone, 'family', None))
    elif not any(k.startswith('backbone.') for k in state):
        state = {f'backbone.{k}': v for k, v in state.items()}
    # the output norms (norm0..3) act after the attention: not needed here
    needed = [
        k for k, _ in model.named_parameters()
        if k.startswith('backbone.') and not re.match(r'backbone\.norm\d+\.', k)
    ]
    missing = [k for k in needed if k not in state]
    if missing:
        raise KeyError(f'{what} {path!r} lacks {len(missing)} backbone parameters of '
                       f'the model, e.g. {missing[:5]}')
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        warnings.warn(f'{what} {path!r}: {len(result.unexpected_keys)} keys match no '
                      f'parameter of the model, e.g. {result.unexpected_keys[:5]}')
    return dict(kept=list(result.missing_keys), unused=list(result.unexpected_keys))


def build_model(cfg: Config,
                checkpoint: Optional[str],
                device: str,
                seed: int,
                what: str = 'checkpoint') -> nn.Module:
    """The config's model in eval mode: weights from ``checkpoint``, else the backbone's
    own (seeded) random initialisation. Pretrained files named in the config are not
    read."""
    scope = task_of(cfg)
    init_default_scope(scope)
    model_cfg = copy.deepcopy(cfg.model)
    if model_cfg.get('backbone') is None:
        raise KeyError('the config has no model.backbone')
    if cfg.get('data_preprocessor') is not None:  # top level in mmpretrain configs
        model_cfg.setdefault('data_preprocessor', copy.deepcopy(cfg.data_preprocessor))
    if 'pretrained' in model_cfg:  # mmseg's model-level pretrained
        model_cfg['pretrained'] = None
    model_cfg['backbone'].pop('pretrained', None)
    model_cfg['backbone']['init_cfg'] = None
    torch.manual_seed(seed)
    model = _registry(scope, 'MODELS').build(model_cfg)
    if checkpoint is None:
        model.backbone.init_weights()
    else:
        load_weights(model, checkpoint, what)
    return model.to(device).eval()


class Prepared(NamedTuple):
    """The image as the backbone receives it."""
    inputs: torch.Tensor  #: (1, 3, H_in, W_in), normalised and padded
    image: np.ndarray  #: (h, w, 3) uint8 RGB, the pipeline's image without padding
    ori_hw: Tuple[int, int]  #: the original image's (height, width)
    to_input: Tuple[float, float, float, float]  #: x_in = ax x + bx, y_in = ay y + by


def _test_pipeline(cfg: Config) -> list:
    dataset = cfg.get('test_dataloader', {}).get('dataset', {})
    pipeline = dataset.get('pipeline') or cfg.get('test_pipeline')
    if not pipeline:
        raise KeyError('the config has neither test_dataloader.dataset.pipeline nor '
                       'test_pipeline')
    return [t for t in pipeline if 'LoadAnnotations' not in t['type']]


def prepare_image(cfg: Config, model: nn.Module, image_path: str) -> Prepared:
    """Run the config's test pipeline and the model's data preprocessor on the image;
    track how original pixel coordinates map into the network input (Resize and
    CenterCrop move pixels; Pad adds them at the bottom / right)."""
    scope = task_of(cfg)
    build = _registry(scope, 'TRANSFORMS').build
    results = dict(img_path=image_path, img_id=0, sample_idx=0)
    ax = ay = 1.
    bx = by = 0.
    packed = None
    for transform in map(build, _test_pipeline(cfg)):
        name = type(transform).__name__
        if name.startswith('Pack'):
            packed = transform(results)
            break
        before = results.get('img')
        results = transform(results)
        if results is None or 'img' not in results:
            raise RuntimeError(f'test pipeline transform {name} returned no image')
        if before is None:
            continue
        (bh, bw), (h, w) = before.shape[:2], results['img'].shape[:2]
        if (bh, bw) == (h, w) or 'Pad' in name:
            continue
        if 'Resize' in name or 'Rescale' in name:  # pixel centres scale
            fx, fy = w / bw, h / bh
            ax, bx = ax * fx, (bx + 0.5) * fx - 0.5
            ay, by = ay * fy, (by + 0.5) * fy - 0.5
        elif name == 'CenterCrop':  # mmcv's rounding
            bx -= max(0, int(round((bw - w) / 2.)))
            by -= max(0, int(round((bh - h) / 2.)))
        else:
            raise ValueError(f'test pipeline transform {name} changes the image size in '
                             'a way this tool cannot map points through (it follows '
                             'Resize, CenterCrop and Pad)')
    if packed is None:
        raise KeyError('the test pipeline ends without a Pack* transform')
    data = model.data_preprocessor(
        dict(inputs=[packed['inputs']], data_samples=[packed['data_samples']]), False)
    h, w = results['img_shape'][:2]
    image = np.ascontiguousarray(results['img'][:h, :w, ::-1])  # BGR -> RGB
    ori_hw = tuple(int(s) for s in results['ori_shape'][:2])
    return Prepared(data['inputs'], image, ori_hw, (ax, bx, ay, by))


def grid_stride(input_hw: Sequence[int], grid_hw: Sequence[int]) -> int:
    """Pixels per token of a stage grid: the smallest power of two s with
    ceil(H_in / s) == h or floor(H_in / s) == h, and the same along W (patch embeddings
    pad the bottom / right, or drop the remainder); ceil(H_in / h) if there is none.
    Unique for grids of more than two tokens along a side; :func:`settle_strides`
    takes it from the first stage's grid and doubles it at every later stage."""
    H, W = input_hw
    h, w = grid_hw
    for e in range(16):
        s = 2**e
        if h in (-(-H // s), H // s) and w in (-(-W // s), W // s):
            return s
    return max(-(-H // h), -(-W // w))


def settle_strides(sites: Sequence['Site'], input_hw: Sequence[int]) -> None:
    """Set every site's ``stride`` from the stage it is in: the first stage's stride
    (from the largest grid) doubled at every later stage, as in PVT and Swin."""
    if not sites:
        return
    first = min(sites, key=lambda s: s.stage)
    base = max(1, grid_stride(input_hw, first.stage_hw) // 2**first.stage)
    for site in sites:
        site.stride = base * 2**site.stage


# --------------------------------------------------------------------------------------
# attention sites: where a block's queries attend
class Rows(NamedTuple):
    """Attention rows of some queries that share their keys."""
    index: np.ndarray  #: positions of these queries in the caller's list
    weights: Dict[str, torch.Tensor]  #: stream -> (m, h, n)
    key_pos: np.ndarray  #: (n, 2) key positions (row, col) on the site's key grid
    valid: np.ndarray  #: (n,) bool, False for keys off the map (padding)


class Site:
    """One attention module of one block: its grids and the rows of chosen queries.

    Subclasses set ``streams``, ``stage_hw`` (query grid), ``key_hw`` (grid the key
    positions refer to), ``key_factor`` (query tokens per key cell along a side),
    ``window`` ((size, shift) or None), ``stage`` and ``block``, and implement
    ``_rows``; ``stride`` (pixels per query token) is set by :func:`settle_strides`.
    """
    streams: Tuple[str, ...] = ()
    window: Optional[Tuple[int, int]] = None
    key_factor = 1
    stride = 1

    @property
    def key_cell(self) -> int:
        """Pixels per key cell along a side."""
        return self.stride * self.key_factor

    def _rows(self, cells: np.ndarray, **kwargs) -> Iterator[Rows]:
        raise NotImplementedError

    # window geometry (pad bottom / right to multiples, roll by -shift, row-major)
    def _window_of(self, cells: np.ndarray):
        ws, shift = self.window
        H, W = self.stage_hw
        Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws
        rr, cc = (cells[:, 0] - shift) % Hp, (cells[:, 1] - shift) % Wp
        index = (rr // ws) * (Wp // ws) + cc // ws
        slot = (rr % ws) * ws + cc % ws
        return index, slot

    def _window_keys(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        ws, shift = self.window
        H, W = self.stage_hw
        Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws
        t = np.arange(ws * ws)
        rows = (index // (Wp // ws) * ws + t // ws + shift) % Hp
        cols = (index % (Wp // ws) * ws + t % ws + shift) % Wp
        return np.stack([rows, cols], 1), (rows < H) & (cols < W)

    def _grid_keys(self) -> Tuple[np.ndarray, np.ndarray]:
        hk, wk = self.key_hw
        t = np.arange(hk * wk)
        return np.stack([t // wk, t % wk], 1), np.ones(hk * wk, dtype=bool)

    # what the tool draws and measures
    def maps(self, cells: np.ndarray) -> Dict[str, np.ndarray]:
        """Per stream (m, h, *key_hw) weights of the queries at ``cells`` (row, col on
        the stage grid) laid out on the key grid; ``'keys'`` (m, *key_hw) marks the keys
        each query ranges over and ``'<stream>_off_map'`` (m, h) the weight on keys off
        the map (padding)."""
        m = len(cells)
        out = {s: np.zeros((m, self.num_heads) + tuple(self.key_hw)) for s in self.streams}
        out.update({f'{s}_off_map': np.zeros((m, self.num_heads)) for s in self.streams})
        out['keys'] = np.zeros((m, ) + tuple(self.key_hw), dtype=bool)
        for rows in self._rows(cells):
            pos = rows.key_pos[rows.valid]
            for s, w in rows.weights.items():
                w = w.double().cpu().numpy()
                for j, i in enumerate(rows.index):
                    out[s][i][:, pos[:, 0], pos[:, 1]] = w[j][:, rows.valid]
                    out[f'{s}_off_map'][i] = w[j][:, ~rows.valid].sum(-1)
            for i in rows.index:
                out['keys'][i][pos[:, 0], pos[:, 1]] = True
        return out

    def entropies(self, cells: np.ndarray, **kwargs) -> Dict[str, np.ndarray]:
        """Per stream (m, h) row entropies (nats) of the queries at ``cells``;
        ``'log_n'`` (m,): the log of the number of keys each row ranges over."""
        m = len(cells)
        out = {s: np.full((m, self.num_heads), np.nan) for s in self.streams}
        out['log_n'] = np.zeros(m)
        for rows in self._rows(cells, **kwargs):
            for s, w in rows.weights.items():
                out[s][rows.index] = attention_entropy(w.double()).cpu().numpy()
            out['log_n'][rows.index] = math.log(self._support(rows.valid))
        return out

    def _support(self, valid: np.ndarray) -> int:
        return int(valid.sum())

    def describe(self) -> dict:
        info = dict(query_grid=list(self.stage_hw), stride=self.stride, num_heads=self.num_heads)
        if self.window is None:
            info.update(layout='global', key_grid=list(self.key_hw), key_cell_pixels=self.key_cell)
        else:
            info.update(layout='window', window_size=self.window[0], shift=self.window[1])
        return info


def _chunks(n: int, size: int = QUERY_CHUNK) -> Iterator[np.ndarray]:
    for start in range(0, n, size):
        yield np.arange(start, min(n, start + size))


class PolaSite(Site):
    """A :class:`PolaLinearAttention` module in a PolaPVT / PolaSwin block."""
    streams = STREAMS

    def __init__(self, name: str, stage: int, block: int, attn: PolaLinearAttention,
                 parent: nn.Module, attn_call, block_call):
        self.name, self.stage, self.block, self.attn = name, stage, block, attn
        self.call = attn_call  #: (args, kwargs) the module received
        self.num_heads = attn.num_heads
        self.alpha = attn.alpha
        self.stage_hw = tuple(int(s) for s in block_call[0][1])
        self._projected = None
        if isinstance(parent, PolaSwinBlock) and parent.window_size is not None:
            ws = parent.window_size
            self.window = (ws, window_shift(self.stage_hw, ws, parent.shifted))
            self.key_hw = self.stage_hw
        else:
            self.window = None
            self.key_hw = attn.key_grid(self.stage_hw)
            self.key_factor = attn.sr_ratio

    def exponents(self) -> np.ndarray:
        """The learned exponents (h, d)."""
        p = pola_exponent(self.attn.power.detach().double(), self.alpha)
        return p[0, :, 0].cpu().numpy()

    def _project(self):
        if self._projected is None:
            args, kwargs = self.call
            with torch.no_grad():
                q, k, _, _, eps, key_hw = self.attn.project(*args, **kwargs)
            if self.window is None and tuple(key_hw) != tuple(self.key_hw):
                raise RuntimeError(f'{self.name}: key grid {key_hw} differs from the '
                                   f'expected {self.key_hw}')
            if torch.is_tensor(eps):
                eps = eps.double()
            self._projected = (q.double(), k.double(), eps)
        return self._projected

    def release(self) -> None:
        self._projected = None

    def _rows(self, cells: np.ndarray, exponent_one: bool = False) -> Iterator[Rows]:
        q, k, eps = self._project()
        power = self.attn.power.detach().double()
        if exponent_one:  # sigmoid(-inf) = 0: p = 1 exactly
            power = torch.full_like(power, float('-inf'))
        if self.window is None:
            key_pos, valid = self._grid_keys()
            flat = torch.as_tensor(cells[:, 0] * self.stage_hw[1] + cells[:, 1], device=q.device)
            for index in _chunks(len(cells)):
                w_sim, w_opp = pola_attention_weights(
                    q[:, :, flat[torch.as_tensor(index, device=q.device)]], k, power, self.alpha,
                    eps)
                yield Rows(
                    index,
                    dict(
                        same_signed=w_sim[0].transpose(0, 1),
                        opposite_signed=w_opp[0].transpose(0, 1)), key_pos, valid)
            return
        windows, slots = self._window_of(cells)
        for window in np.unique(windows):
            members = np.nonzero(windows == window)[0]
            key_pos, valid = self._window_keys(int(window))
            w_eps = eps[window:window + 1] if torch.is_tensor(eps) else eps
            for part in _chunks(len(members)):
                index = members[part]
                w_sim, w_opp = pola_attention_weights(
                    q[window:window + 1, :,
                      torch.as_tensor(slots[index], device=q.device)], k[window:window + 1], power,
                    self.alpha, w_eps)
                yield Rows(
                    index,
                    dict(
                        same_signed=w_sim[0].transpose(0, 1),
                        opposite_signed=w_opp[0].transpose(0, 1)), key_pos, valid)


class SoftmaxSRASite(Site):
    """Baseline PVT spatial-reduction attention (mmdet ``SpatialReductionAttention``,
    an ``nn.MultiheadAttention`` over the reduced keys)."""
    streams = ('softmax', )

    def __init__(self, name: str, module: nn.Module, module_call, mha_call):
        self.name, self.module = name, module
        self.mha = module.attn
        self.num_heads = self.mha.num_heads
        self.stage_hw = tuple(int(s) for s in module_call[0][1])
        args, kwargs = mha_call
        names = ('query', 'key', 'value')
        query, key, value = (kwargs[n] if n in kwargs else args[i] for i, n in enumerate(names))
        if self.mha.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        self.query, self.key, self.value = query, key, value  # (L, B, C)
        r = getattr(module, 'sr_ratio', 1)
        H, W = self.stage_hw
        self.key_hw = (H // r, W // r) if r > 1 else (H, W)  # conv without padding
        if self.key_hw[0] * self.key_hw[1] != key.shape[0]:
            raise RuntimeError(f'{name}: {key.shape[0]} keys do not form the expected '
                               f'{self.key_hw} grid')
        self.key_factor = r

    def _rows(self, cells: np.ndarray) -> Iterator[Rows]:
        key_pos, valid = self._grid_keys()
        flat = torch.as_tensor(cells[:, 0] * self.stage_hw[1] + cells[:, 1])
        for index in _chunks(len(cells)):
            q_rows = self.query[flat[torch.as_tensor(index)].to(self.query.device)]
            if self.mha.batch_first:
                q_rows, key, value = (t.transpose(0, 1) for t in (q_rows, self.key, self.value))
            else:
                key, value = self.key, self.value
            with torch.no_grad():
                _, weights = self.mha(
                    q_rows, key, value, need_weights=True,
                    average_attn_weights=False)  # (B, h, m, n)
            yield Rows(index, dict(softmax=weights[0].transpose(0, 1)), key_pos, valid)

    def _support(self, valid: np.ndarray) -> int:
        return len(valid)


class SoftmaxWindowSite(Site):
    """Baseline Swin (shifted) window attention (mmdet / mmseg ``ShiftWindowMSA``): the
    weights its ``w_msa.softmax`` produced, shift mask included."""
    streams = ('softmax', )

    def __init__(self, name: str, module: nn.Module, module_call, attn):
        self.name, self.module = name, module
        self.stage_hw = tuple(int(s) for s in module_call[0][1])
        self.window = (int(module.window_size), int(module.shift_size))
        self.key_hw = self.stage_hw
        self.attn = attn  # (B * nW, h, T, T)
        self.num_heads = attn.shape[1]

    def _rows(self, cells: np.ndarray) -> Iterator[Rows]:
        windows, slots = self._window_of(cells)
        for window in np.unique(windows):
            index = np.nonzero(windows == window)[0]
            key_pos, valid = self._window_keys(int(window))
            rows = self.attn[int(window)][:, torch.as_tensor(slots[index], device=self.attn.device)]
            yield Rows(index, dict(softmax=rows.transpose(0, 1)), key_pos, valid)

    def _support(self, valid: np.ndarray) -> int:
        return len(valid)  # padded keys are not masked in the softmax window


_POLA_NAME = re.compile(r'(?:^|\.)(?:layers|stages)\.(\d+)\.blocks\.(\d+)\.attn$')


class _Recorder:
    """Forward hooks that keep the inputs (pre) or outputs (out) of modules, and the
    order of the first call of each."""

    def __init__(self):
        self.calls, self.order, self._handles = {}, {}, []

    def pre(self, module: nn.Module, key):

        def hook(mod, args, kwargs):
            self.calls[key] = (args, kwargs)
            self.order.setdefault(key, len(self.order))

        self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def out(self, module: nn.Module, key):

        def hook(mod, args, output):
            self.calls[key] = output

        self._handles.append(module.register_forward_hook(hook))

    def run(self, backbone: nn.Module, inputs: torch.Tensor) -> None:
        try:
            with torch.no_grad():
                backbone(inputs)
        finally:
            for handle in self._handles:
                handle.remove()


def collect_pola_sites(backbone: nn.Module, inputs: torch.Tensor) -> List[PolaSite]:
    """Every :class:`PolaLinearAttention` of the backbone with the inputs it received
    in one forward pass over ``inputs``, in stage / block order."""
    found = []
    for name, module in backbone.named_modules():
        if isinstance(module, PolaLinearAttention):
            match = _POLA_NAME.search(name)
            if match is None:
                raise ValueError(f'{name}: a Pola attention module outside the '
                                 'layers.<i>.blocks.<j> / stages.<i>.blocks.<j> layout '
                                 'of PolaPVT / PolaSwin')
            parent = backbone.get_submodule(name.rsplit('.', 1)[0])
            found.append((name, int(match[1]), int(match[2]), module, parent))
    recorder = _Recorder()
    for name, _, _, module, parent in found:
        recorder.pre(module, name)
        recorder.pre(parent, name + '/block')
    recorder.run(backbone, inputs)
    sites = [
        PolaSite(name, stage, block, module, parent, recorder.calls[name],
                 recorder.calls[name + '/block']) for name, stage, block, module, parent in found
    ]
    settle_strides(sites, inputs.shape[-2:])
    return sorted(sites, key=lambda s: (s.stage, s.block))


def collect_softmax_sites(backbone: nn.Module, inputs: torch.Tensor) -> List[Site]:
    """The softmax attention modules of an mmdet / mmseg ``PyramidVisionTransformer``
    or ``SwinTransformer`` backbone with what they computed on ``inputs``; each gets a
    ``stage`` (stage grids change between stages) and ``block`` (depth in the stage)."""
    found = []
    for name, module in backbone.named_modules():
        if hasattr(module, 'w_msa') and hasattr(module, 'shift_size') and isinstance(
                getattr(module.w_msa, 'softmax', None), nn.Softmax):
            found.append(('window', name, module))
        elif hasattr(module, 'sr_ratio') and isinstance(
                getattr(module, 'attn', None), nn.MultiheadAttention):
            found.append(('sra', name, module))
    if not found:
        raise ValueError(f'baseline backbone {type(backbone).__name__}: no softmax '
                         'attention of a PVT (SpatialReductionAttention) or Swin '
                         '(ShiftWindowMSA) backbone found')
    recorder = _Recorder()
    for kind, name, module in found:
        recorder.pre(module, name)
        if kind == 'window':
            recorder.out(module.w_msa.softmax, name + '/softmax')
        else:
            recorder.pre(module.attn, name + '/mha')
    recorder.run(backbone, inputs)
    sites = []
    for kind, name, module in sorted(found, key=lambda f: recorder.order[f[1]]):
        call = recorder.calls[name]
        if kind == 'window':
            site = SoftmaxWindowSite(name, module, call, recorder.calls[name + '/softmax'])
        else:
            site = SoftmaxSRASite(name, module, call, recorder.calls[name + '/mha'])
        sites.append(site)
    stage, block = -1, 0
    for i, site in enumerate(sites):
        if i == 0 or site.stage_hw != sites[i - 1].stage_hw:
            stage, block = stage + 1, 0
        site.stage, site.block = stage, block
        block += 1
    settle_strides(sites, inputs.shape[-2:])
    return sites


# --------------------------------------------------------------------------------------
# points and queries
def point_cells(points_input: np.ndarray, site: Site) -> np.ndarray:
    """Stage-grid cells (row, col) of points given in input pixels (x, y)."""
    cells = np.floor(points_input[:, ::-1] / site.stride).astype(int)
    return np.minimum(np.maximum(cells, 0), np.array(site.stage_hw) - 1)


def sample_cells(site: Site, image_hw: Sequence[int], count: int, seed: int) -> np.ndarray:
    """Up to ``count`` distinct random tokens of the site's grid that lie on the image
    (not on the preprocessor's padding)."""
    rows = min(site.stage_hw[0], -(-image_hw[0] // site.stride))
    cols = min(site.stage_hw[1], -(-image_hw[1] // site.stride))
    rng = np.random.default_rng([seed, site.stage, site.block])
    flat = rng.choice(rows * cols, size=min(count, rows * cols), replace=False)
    return np.stack([flat // cols, flat % cols], 1)


def _render(grid: np.ndarray, cell: int, image_hw: Sequence[int]) -> np.ndarray:
    """A key-grid map as an image-sized array: each cell covers cell x cell pixels."""
    up = np.repeat(np.repeat(grid, cell, axis=0), cell, axis=1)
    out = np.zeros(tuple(image_hw), dtype=up.dtype)
    h, w = min(up.shape[0], image_hw[0]), min(up.shape[1], image_hw[1])
    out[:h, :w] = up[:h, :w]
    return out


def _peak(weights: np.ndarray, site: Site) -> dict:
    """Largest weight of each head's map and the input-pixel centre of its key cell."""
    heads = weights.reshape(weights.shape[0], -1)
    flat = heads.argmax(-1)
    rows, cols = np.unravel_index(flat, weights.shape[1:])
    return dict(
        max_weight=heads.max(-1).tolist(),
        argmax_xy=[[(c + 0.5) * site.key_cell, (r + 0.5) * site.key_cell]
                   for r, c in zip(rows, cols)])


# --------------------------------------------------------------------------------------
# figures
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


# --------------------------------------------------------------------------------------
def _default_points(ori_hw: Sequence[int]) -> List[Tuple[float, float]]:
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


def _check_inputs(args: argparse.Namespace) -> Tuple[List[Tuple[float, float]], str]:
    """The query points (the defaults when none are given) and the device, after checking
    that the files exist, the image reads and the points lie on it."""
    for path, what in ((args.image, 'image'), (args.config, 'config'), (args.baseline_config,
                                                                        'baseline config')):
        if path is not None and not osp.isfile(path):
            raise FileNotFoundError(f'{what} file not found: {path}')
    points = parse_points(args.points)
    image = mmcv.imread(args.image)
    if image is None:
        raise ValueError(f'cannot read an image from {args.image}')
    ori_h, ori_w = image.shape[:2]
    points = points or _default_points((ori_h, ori_w))
    for x, y in points:
        if not (0 <= x < ori_w and 0 <= y < ori_h):
            raise ValueError(f'--points {x:g},{y:g} lies outside the image '
                             f'({ori_w} x {ori_h} pixels)')
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if device == 'cuda' and not torch.cuda.is_available():
        raise RuntimeError('--device cuda: torch sees no CUDA device (use --device cpu)')
    return points, device


def _load_configs(args: argparse.Namespace) -> Tuple[Config, Optional[Config], str]:
    """The config, the baseline config (or None) and the note on the weights every
    figure carries; the checkpoint must exist, and random weights are warned of loudly."""
    cfg = load_config(args.config)
    base_cfg = load_config(args.baseline_config) if args.baseline_config else None
    if args.checkpoint is not None:
        require_checkpoint(args.checkpoint, '--checkpoint')
    else:
        _loud_warning(RANDOM_WEIGHTS_WARNING)
    if base_cfg is not None and args.baseline_checkpoint is None:
        _loud_warning(RANDOM_BASELINE_WARNING)
    random_note = ('RANDOM INITIALISATION (no checkpoint): an untrained model'
                   if args.checkpoint is None else f'weights: {osp.basename(args.checkpoint)}')
    return cfg, base_cfg, random_note


def _input_points(prepared: Prepared, points: Sequence[Tuple[float, float]]) -> np.ndarray:
    """The query points in the pixels of the model's input image (clipped to it)."""
    ax_, bx, ay, by = prepared.to_input
    points_input = np.array([[ax_ * x + bx, ay * y + by] for x, y in points])
    return np.clip(points_input, 0, np.array(prepared.image.shape[:2][::-1]) - 1)


def _pola_sites(args: argparse.Namespace, model: nn.Module, prepared: Prepared) -> List[PolaSite]:
    """The Pola blocks to analyse (those of ``--stages``); an error when there is none."""
    sites = collect_pola_sites(model.backbone, prepared.inputs)
    if not sites:
        raise ValueError(f'{args.config}: backbone {type(model.backbone).__name__} has no '
                         "Pola linear-attention ('L') block")
    if args.stages is not None:
        sites = [s for s in sites if s.stage in args.stages]
        if not sites:
            raise ValueError(f'--stages {args.stages}: no Pola block in these stages')
    return sites


def _baseline_sites(args: argparse.Namespace, base_cfg: Optional[Config], device: str,
                    prepared: Prepared) -> Dict[Tuple[int, int], Site]:
    """The softmax blocks of the baseline (none without one), by (stage, block)."""
    baseline_sites = {}
    if base_cfg is not None:
        base_model = build_model(
            base_cfg, args.baseline_checkpoint, device, args.seed, what='--baseline-checkpoint')
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


def _analyse_block(args: argparse.Namespace, site: PolaSite, base: Optional[Site],
                   prepared: Prepared, points: Sequence[Tuple[float, float]],
                   points_input: np.ndarray, random_note: str) -> Tuple[str, dict]:
    """Draw one Pola block's figure (with its baseline block ``base``, if any) and
    measure it; returns the figure's path and the block's numbers for the JSON."""
    # the same stage and depth; grids may differ by a token where one backbone
    # pads and the other drops a remainder: points map through pixels
    cells = point_cells(points_input, site)
    maps = site.maps(cells)
    base_maps = base.maps(point_cells(points_input, base)) if base else None
    png = osp.join(args.out_dir, f'attention_s{site.stage}_b{site.block}.png')
    draw_block(png, site, base, prepared.image, points_input, points, maps, base_maps,
               args.per_head, random_note, args.dpi)

    queries = sample_cells(site, prepared.image.shape[:2], args.num_queries, args.seed)
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


def _summary(args: argparse.Namespace, prepared: Prepared, base_cfg: Optional[Config],
             points: Sequence[Tuple[float, float]], points_input: np.ndarray, blocks: List[dict],
             stages: List[dict]) -> dict:
    """The contents of ``attention.json``."""
    return dict(
        config=args.config,
        checkpoint=args.checkpoint,
        random_weights=args.checkpoint is None,
        image=args.image,
        image_shape=list(prepared.ori_hw),
        input_image_shape=list(prepared.image.shape[:2]),
        input_shape=list(prepared.inputs.shape[-2:]),
        baseline_config=args.baseline_config,
        baseline_checkpoint=args.baseline_checkpoint,
        baseline_random_weights=(base_cfg is not None and args.baseline_checkpoint is None),
        points=[
            dict(image_xy=list(pt), input_xy=pi.tolist()) for pt, pi in zip(points, points_input)
        ],
        seed=args.seed,
        num_queries=args.num_queries,
        entropy_note=('mean over sampled query tokens of each row\'s entropy (nats, the '
                      'row renormalised to sum to 1); log_n is the mean log of the number '
                      'of keys a row ranges over. Measured on this image with these '
                      'weights; docs/advanced_guides/method.md section 5 explains why the '
                      'power function need not lower it.'),
        blocks=blocks,
        stages=stages)


def main(argv: Optional[List[str]] = None) -> dict:
    """Run the analysis; returns the paths it wrote (``json``, ``entropy``,
    ``exponents`` and ``blocks``: one PNG per analysed block)."""
    args = parse_args(argv)
    points, device = _check_inputs(args)
    cfg, base_cfg, random_note = _load_configs(args)
    model = build_model(cfg, args.checkpoint, device, args.seed)
    prepared = prepare_image(cfg, model, args.image)
    points_input = _input_points(prepared, points)
    sites = _pola_sites(args, model, prepared)
    baseline_sites = _baseline_sites(args, base_cfg, device, prepared)

    os.makedirs(args.out_dir, exist_ok=True)
    written = dict(blocks=[])
    blocks = []
    for site in sites:
        png, info = _analyse_block(args, site, baseline_sites.get((site.stage, site.block)),
                                   prepared, points, points_input, random_note)
        written['blocks'].append(png)
        blocks.append(info)
    stages = _stage_summaries(sites, blocks)

    written['entropy'] = osp.join(args.out_dir, 'entropy.png')
    draw_entropy(written['entropy'], blocks, random_note, args.dpi)
    written['exponents'] = osp.join(args.out_dir, 'exponents.png')
    draw_exponents(written['exponents'], stages, max(s.alpha for s in sites), random_note, args.dpi)
    summary = _summary(args, prepared, base_cfg, points, points_input, blocks, stages)
    written['json'] = osp.join(args.out_dir, 'attention.json')
    with open(written['json'], 'w') as f:
        json.dump(_json_safe(summary), f, indent=1)
    print(f'wrote {len(written["blocks"])} block figures, {written["entropy"]}, '
          f'{written["exponents"]} and {written["json"]}')
    return written


if __name__ == '__main__':
    main()
