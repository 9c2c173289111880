"""Attention sites: where the queries of a block attend, and with which weights.

A *site* is one attention module of one backbone block, recorded in one no-grad forward
pass over an input: its query grid, the grid its keys lie on, its window (if any) and what
it received or computed. From a site come the attention rows of chosen queries, as maps on
the key grid (:meth:`Site.maps`) and as row entropies (:meth:`Site.entropies`).

* :class:`PolaSite`: a :class:`~polaformer_mm.models.attention.PolaLinearAttention` of a
  block of a Pola backbone, found by the names its family declares
  (``BackboneFamily.attention_names``). ``PolaLinearAttention.project`` turns its recorded
  inputs into
  the queries and keys the module uses; the weights of the queries that are needed come
  from :func:`polaformer_mm.ops.pola_attention_weights` (float64), O(n) per query, without
  an N x n matrix. Two streams: same-signed and opposite-signed.
* :class:`SoftmaxSRASite` / :class:`SoftmaxWindowSite`: the softmax attention of the mmdet /
  mmseg ``PyramidVisionTransformer`` (spatial reduction) and ``SwinTransformer`` (shifted
  windows, shift mask included) baselines.

:func:`collect_pola_sites` and :func:`collect_softmax_sites` find and record them;
:func:`point_cells` and :func:`sample_cells` choose query tokens.
"""
import inspect
import math
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from ..models.attention import PolaLinearAttention
from ..models.family import family_of
from ..models.window_geometry import padded_size, window_shift
from ..ops import attention_entropy, pola_attention_weights, pola_exponent

__all__ = [
    'STREAMS', 'Rows', 'Site', 'PolaSite', 'SoftmaxSRASite', 'SoftmaxWindowSite',
    'collect_pola_sites', 'collect_softmax_sites', 'grid_stride', 'settle_strides', 'point_cells',
    'sample_cells'
]

STREAMS = ('same_signed', 'opposite_signed')
QUERY_CHUNK = 64  # query rows per weight computation (memory: chunk x heads x keys)


# --------------------------------------------------------------------------------------
# strides: pixels per token of a stage grid
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
    def _padded_hw(self) -> Tuple[int, int]:
        """The stage map padded to multiples of the window (:func:`padded_size`)."""
        H, W = self.stage_hw
        return padded_size(H, self.window[0]), padded_size(W, self.window[0])

    def _window_of(self, cells: np.ndarray):
        ws, shift = self.window
        Hp, Wp = self._padded_hw()
        rr, cc = (cells[:, 0] - shift) % Hp, (cells[:, 1] - shift) % Wp
        index = (rr // ws) * (Wp // ws) + cc // ws
        slot = (rr % ws) * ws + cc % ws
        return index, slot

    def _window_keys(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        ws, shift = self.window
        H, W = self.stage_hw
        Hp, Wp = self._padded_hw()
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
        """The site's layout for a report: grids, stride, heads and window."""
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
    """A :class:`PolaLinearAttention` module in a block of a Pola backbone. A module whose
    queries also attend to keys that lie on no grid cell (its ``off_grid_keys``, e.g. a
    class token's key, first among the keys of its ``project_attended``) has their weight
    in the ``'<stream>_off_map'`` of :meth:`~Site.maps`; such keys count in the row's
    support."""
    streams = STREAMS

    def __init__(self, name: str, stage: int, block: int, attn: PolaLinearAttention,
                 parent: nn.Module, attn_call, block_call):
        self.name, self.stage, self.block, self.attn = name, stage, block, attn
        self.call = attn_call  #: (args, kwargs) the module received
        self.num_heads = attn.num_heads
        self.alpha = attn.alpha
        self.stage_hw = tuple(int(s) for s in block_call[0][1])
        self._projected = None
        if getattr(parent, 'window_size', None) is not None and hasattr(parent, 'shifted'):
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

    @property
    def off_grid(self) -> int:
        """How many keys, first among the module's keys, lie on no grid cell."""
        return int(getattr(self.attn, 'off_grid_keys', 0))

    def _grid_keys(self) -> Tuple[np.ndarray, np.ndarray]:
        key_pos, valid = super()._grid_keys()
        if not self.off_grid:
            return key_pos, valid
        return (np.concatenate([np.zeros((self.off_grid, 2), dtype=key_pos.dtype), key_pos]),
                np.concatenate([np.zeros(self.off_grid, dtype=bool), valid]))

    def _support(self, valid: np.ndarray) -> int:
        return int(valid.sum()) + self.off_grid  # keys off the grid are keys too

    def describe(self) -> dict:
        """The layout (see :meth:`Site.describe`) and the keys off the grid, if any."""
        info = super().describe()
        if self.off_grid:
            info['off_grid_keys'] = (f'{self.off_grid} key(s) off the grid (their weight: '
                                     '<stream>_off_map)')
        return info

    def _call_arguments(self) -> dict:
        """The recorded call as keyword arguments of ``forward`` (some blocks pass the
        positional encoding of the stage, windowed ones a padding mask)."""
        args, kwargs = self.call
        bound = inspect.signature(self.attn.forward).bind(*args, **kwargs)
        return dict(bound.arguments)

    def _project_call(self):
        """The module's ``project_attended`` (its queries with every key they attend to,
        those off the grid first) or, where it has none, ``project``
        (:meth:`PolaLinearAttention.project`), on the recorded call."""
        project = getattr(self.attn, 'project_attended', self.attn.project)
        return project(**self._call_arguments())

    def _project(self):
        if self._projected is None:
            with torch.no_grad():
                q, k, _, _, eps, key_hw = self._project_call()
            if self.window is None and tuple(key_hw) != tuple(self.key_hw):
                raise RuntimeError(f'{self.name}: key grid {key_hw} differs from the '
                                   f'expected {self.key_hw}')
            if torch.is_tensor(eps):
                eps = eps.double()
            self._projected = (q.double(), k.double(), eps)
        return self._projected

    def release(self) -> None:
        """Drop the projected queries and keys (recomputed when needed again)."""
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
    family = family_of(backbone)
    found = []
    for name, module in backbone.named_modules():
        if isinstance(module, PolaLinearAttention):
            if family is None or family.attention_names is None:
                what = ('belongs to no registered family' if family is None else
                        f'belongs to the family {family.name!r}, which declares no '
                        'attention_names')
                raise ValueError(
                    f'{name}: the {type(backbone).__name__} backbone {what}; the attention '
                    'analysis finds Pola attention modules by BackboneFamily.attention_names, '
                    'a regex of their module names with the groups block and, for several '
                    "stages, stage (PolaPVT's: "
                    r"'(?:^|\.)layers\.(?P<stage>\d+)\.blocks\.(?P<block>\d+)\.attn$'"
                    '); docs/notes/developer_guide.md, "Adding a backbone family"')
            site = family.attention_site(name)
            if site is None:
                raise ValueError(
                    f'{name}: a Pola attention module outside the attention names of the '
                    f'{type(backbone).__name__} backbone\'s family '
                    f'({getattr(family, "attention_names", None)!r}; '
                    'BackboneFamily.attention_names)')
            parent = backbone.get_submodule(name.rsplit('.', 1)[0])
            found.append((name, site[0], site[1], module, parent))
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
