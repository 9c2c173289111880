"""The warm start of a Pola backbone from a softmax checkpoint.

1. The file is read weights-only and its backbone part taken (``prefix``; by default
   ``'backbone.'`` when its keys carry it).
2. Its key layout is recognised (:mod:`.layouts`) and brought to the layout of the
   backbone's *softmax twin*: the same backbone, built with the same arguments but
   every block 'S'.
3. The twin loads it strictly: a file of another size or family is an error that names
   the mismatching keys and the arch the file fits.
4. The backbone is initialised as a fresh model is (``init_weights()`` without
   ``init_cfg``); every tensor outside the attention modules is copied from the twin
   by name, and every softmax attention is translated into the Pola attention at the
   same path (:func:`.translate.translate`). The rest keeps its fresh value.
5. A :class:`~.report.WarmStartReport` says what was loaded from which file tensor,
   what is new, and which file tensors were left unused.
"""
import inspect
import re
from collections import OrderedDict
from typing import Dict, Optional, Set, Tuple

import torch
import torch.nn as nn
from mmengine.logging import MMLogger

from ...utils.checkpoint_io import load_checkpoint
from ..attention import PolaLinearAttention
from ..backbones.base import PolaBackboneBase
from ..family import families, family_named, family_of
from ..official_weights import extract_state_dict, refuse_non_finite
from .layouts import POLA_KEYS, Converted, Layout, find_layout, layouts_of
from .report import WarmStartReport
from .translate import translate

#: the keys of ``init_cfg=dict(type='WarmStart', ...)``
INIT_CFG_KEYS = ('type', 'checkpoint', 'prefix')
_ROLE_NAMES = dict(q='query', k='key', v='value', g='gate')


class WarmStartError(ValueError):
    """A softmax checkpoint that does not fit the backbone: another family, another
    size, a Pola checkpoint or a layout the warm start does not know."""


def backbone_family(backbone: nn.Module) -> str:
    """The name of the registered family of a Pola backbone (or of a subclass of one's
    class), e.g. 'pvt' (:func:`polaformer_mm.models.family.family_of`)."""
    family = family_of(backbone)
    if family is None:
        known = ', '.join(f.backbone.__name__ for f in families())
        raise TypeError(f'a warm start needs a Pola backbone ({known}), '
                        f'got {type(backbone).__name__}')
    return family.name


def _title(family: str) -> str:
    """The family ``family`` in messages, e.g. 'PVT v1'."""
    return family_named(family).title


def describe(backbone: PolaBackboneBase) -> str:
    """``"PolaPVT(arch='tiny', attn_types='LLLL')"``."""
    args = backbone.init_args()
    shown = ', '.join(f'{k}={args[k]!r}' for k in ('arch', 'attn_types') if k in args)
    return f'{type(backbone).__name__}({shown})'


def read_softmax_checkpoint(
        checkpoint: str,
        prefix: Optional[str] = None) -> Tuple[Dict[str, torch.Tensor], Dict[str, str], str]:
    """The backbone part of a checkpoint (weights-only), the file keys outside it (with
    the reason) and the prefix used (``None``: ``'backbone.'`` when keys carry it, else
    none)."""
    if not checkpoint:
        raise ValueError("a warm start needs a 'checkpoint' (a softmax checkpoint file)")
    state_dict = extract_state_dict(
        load_checkpoint(checkpoint, what='warm-start checkpoint'), source=str(checkpoint))
    if prefix is None:
        prefix = 'backbone.' if any(k.startswith('backbone.') for k in state_dict) else ''
    if not prefix:
        return dict(state_dict), {}, ''
    inside = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not inside:
        raise KeyError(f'no key of {checkpoint!r} starts with prefix {prefix!r}; first keys: '
                       f'{list(state_dict)[:5]}')
    outside = {k: f'outside prefix {prefix!r}' for k in state_dict if not k.startswith(prefix)}
    return inside, outside, prefix


def softmax_twin(backbone: PolaBackboneBase, **overrides) -> PolaBackboneBase:
    """The same backbone with every block softmax ('S'), no ``init_cfg``; built
    without touching the global random state."""
    args = backbone.init_args()
    params = inspect.signature(type(backbone)).parameters
    args['attn_types'] = 'S' * len(str(backbone.attn_types))
    args.update({k: None for k in ('init_cfg', 'pretrained') if k in params})
    args.update(overrides)
    with torch.random.fork_rng(devices=[]):
        return type(backbone)(**args)


def _choose_layout(state_dict, backbone: PolaBackboneBase, source: str) -> Layout:
    family = backbone_family(backbone)
    keys = list(state_dict)
    name = describe(backbone)
    pola = next((k for k in keys if re.search(POLA_KEYS, k)), None)
    if pola is not None:
        raise WarmStartError(
            f'{source!r} holds Pola attention ({pola!r}): it is a Pola checkpoint, not a '
            f'softmax one; load it with init_cfg=dict(type=\'Pretrained\', checkpoint=...)')
    layout, others = find_layout(keys, family)
    if layout is not None:
        return layout
    known = '; '.join(lay.name for lay in layouts_of(family))
    if others:
        other = others[0]
        raise WarmStartError(
            f'{source!r} is a {_title(other.family)} checkpoint ({other.name}), but '
            f'{name} warm-starts from {_title(family)} checkpoints ({known}); use the '
            f'Pola backbone of the {_title(other.family)} family for it')
    raise WarmStartError(f'{source!r}: its keys are in no {_title(family)} softmax layout '
                         f'{name} reads ({known}); first keys: {keys[:6]} (is the prefix '
                         'right?)')


def _fits(twin: nn.Module, state_dict) -> Tuple[list, list, list]:
    """Shape mismatches, missing and unexpected keys of ``state_dict`` for ``twin``."""
    own = twin.state_dict()
    optional = twin._optional_key
    mismatched = [
        f'{k}: file {tuple(v.shape)} vs model {tuple(own[k].shape)}' for k, v in state_dict.items()
        if k in own and v.shape != own[k].shape
    ]
    missing = [k for k in own if k not in state_dict and not optional(k)]
    unexpected = [k for k in state_dict if k not in own and not optional(k)]
    return mismatched, missing, unexpected


def guess_arch(backbone: PolaBackboneBase, state_dict) -> Optional[str]:
    """The arch of the backbone's family whose softmax twin (other arguments as the
    backbone's) fits ``state_dict`` exactly; None if none does. Twins are built on the
    meta device where the backbone allows it."""
    # the full names first (an arch zoo may hold a short name beside the full one)
    for arch in sorted((a for a in type(backbone).arch_zoo if len(a) > 1),
                       key=lambda a: (-len(a), a)):
        for device in ('meta', 'cpu'):
            try:
                with torch.device(device):
                    twin = softmax_twin(backbone, arch=arch)
            except Exception:  # an arch these arguments do not build: not a candidate
                continue
            if not any(_fits(twin, state_dict)):
                return arch
            break
    return None


def fit_grids(twin: PolaBackboneBase, converted: Converted) -> Converted:
    """Position tables of the file resized to the twin's grids, where the backbone
    resizes them on load itself (a backbone's ``_fit_grids``: e.g. a class-token position
    table learned at another size)."""
    fit = getattr(twin, '_fit_grids', None)
    if fit is None:
        return converted
    fitted = fit(OrderedDict(converted.state_dict))
    origin = dict(converted.origin)
    for key, value in fitted.items():
        if value.shape != converted.state_dict[key].shape:
            file_key, how = origin[key]
            origin[key] = (file_key,
                           '; '.join(filter(None, [how, f'resized to {tuple(value.shape)}'])))
    return converted._replace(state_dict=OrderedDict(fitted), origin=origin)


def drop_outside(twin: nn.Module, converted: Converted) -> Converted:
    """The file's keys of modules the backbone does not have at all (``neck.*``,
    ``head.*`` of a whole-model file whose backbone keys carry no prefix) moved to the
    unused ones: no tensor of the backbone can take them, and the rest is loaded as
    strictly as ever."""
    tops = {k.split('.', 1)[0] for k in twin.state_dict()}
    outside = [k for k in converted.state_dict if k.split('.', 1)[0] not in tops]
    if not outside:
        return converted
    dropped = dict(converted.dropped)
    for key in outside:
        dropped[converted.origin[key][0]] = (
            f'a module the backbone has none of ({key.split(".", 1)[0]}); the keys of a '
            "whole-model file's backbone carry no prefix here")
    return converted._replace(
        state_dict=OrderedDict((k, v) for k, v in converted.state_dict.items() if k not in outside),
        dropped=dropped)


def load_twin(twin: PolaBackboneBase, converted: Converted, backbone: PolaBackboneBase, source: str,
              layout: Layout) -> Tuple[Set[str], Dict[str, str]]:
    """Load the converted file into the twin, strictly (keys the backbone declares
    optional, Swin's output norms, may be absent or extra); returns the twin keys taken
    from the file and the file keys the backbone has no place for."""
    state_dict = converted.state_dict
    mismatched, missing, unexpected = _fits(twin, state_dict)
    if mismatched or missing or unexpected:
        parts = []
        if mismatched:
            parts.append(f'{len(mismatched)} shape mismatches, e.g. {mismatched[:4]}')
        if missing:
            parts.append(f'{len(missing)} missing keys, e.g. {missing[:4]}')
        if unexpected:
            named = [converted.origin[k][0] for k in unexpected]
            parts.append(f'{len(unexpected)} unexpected keys, e.g. {named[:4]}')
        arch = guess_arch(backbone, state_dict)
        family = _title(backbone_family(backbone))
        hint = (f"the file fits {type(backbone).__name__} arch {arch!r}: set arch='{arch}'"
                if arch else f'it fits no {type(backbone).__name__} arch '
                f'{sorted(a for a in type(backbone).arch_zoo if len(a) > 1)} with these '
                'arguments (depths, widths, heads, window_size, pretrain_img_size)')
        raise WarmStartError(f'{source!r} ({layout.name}, a {family} checkpoint) does not fit '
                             f'{describe(backbone)}: ' + '; '.join(parts) + f'. {hint}')
    own = twin.state_dict()
    taken = {k: v for k, v in state_dict.items() if k in own}
    twin.load_state_dict({**own, **taken}, strict=True)
    extra = {
        converted.origin[k][0]: 'this backbone has no such tensor'
        for k in state_dict if k not in own
    }
    return set(taken), extra


def fresh_init(backbone: PolaBackboneBase) -> None:
    """Initialise ``backbone`` as a fresh model is: ``init_weights()`` without
    ``init_cfg``."""
    saved = backbone.init_cfg
    backbone.init_cfg = None
    try:
        backbone.init_weights()
    finally:
        backbone.init_cfg = saved


class _Transfer:
    """Copies from the loaded twin into the backbone, and fills the report."""

    def __init__(self, backbone, twin, converted: Converted, from_file: Set[str], prefix: str,
                 report: WarmStartReport):
        self.own, self.twin = backbone.state_dict(), twin.state_dict()
        self.converted, self.from_file, self.prefix = converted, from_file, prefix
        self.report = report
        self.used: Set[str] = set()  # twin keys copied
        self.twin_unused: Dict[str, str] = {}  # twin key -> why
        self.covered: Dict[str, list] = {}  # backbone key -> rows copied

    def source(self, twin_key: str, rows: Optional[slice] = None) -> str:
        """The file tensor behind ``twin_key`` (rows of it), as the report names it."""
        file_key, how = self.converted.origin[twin_key]
        for start, stop, piece in self.converted.pieces.get(twin_key, ()):
            if rows is not None and start <= rows.start and rows.stop <= stop:
                whole = (rows.start, rows.stop) == (start, stop)
                how = '' if whole else f'rows {rows.start - start}:{rows.stop - start}'
                return self.prefix + piece + (f' ({how})' if how else '')
        offset = re.fullmatch(r'rows (\d+):(\d+)', how)
        if rows is not None:
            start = int(offset[1]) if offset else 0
            how = f'rows {start + rows.start}:{start + rows.stop}'
        return self.prefix + file_key + (f' ({how})' if how else '')

    def copy(self, key: str, rows: Optional[slice], twin_key: str,
             twin_rows: Optional[slice]) -> None:
        src = self.twin[twin_key] if twin_rows is None else self.twin[twin_key][twin_rows]
        dst = self.own[key] if rows is None else self.own[key][rows]
        if src.shape != dst.shape:
            raise WarmStartError(f'{twin_key} {tuple(src.shape)} cannot become {key} '
                                 f'{tuple(dst.shape)}')
        with torch.no_grad():
            dst.copy_(src)
        where = '' if rows is None else f'rows {rows.start}:{rows.stop} <- '
        self.report.loaded.setdefault(key, []).append(where + self.source(twin_key, twin_rows))
        self.used.add(twin_key)
        if rows is not None:
            self.covered.setdefault(key, []).append(rows)

    def attention(self, path: str, pola: PolaLinearAttention, softmax: nn.Module) -> None:
        """Translate the softmax attention at ``path`` into the Pola one."""
        copies, unused = translate(softmax, pola)
        for c in copies:
            if f'{path}.{c.softmax}' in self.from_file:
                self.copy(f'{path}.{c.pola}', c.pola_rows, f'{path}.{c.softmax}', c.softmax_rows)
        self.twin_unused.update({f'{path}.{k}': why for k, why in unused.items()})
        for role, (layer, rows) in pola.projection_rows().items():
            for name in ('weight', 'bias'):
                key = f'{path}.{layer}.{name}'
                if key in self.covered and rows not in self.covered[key]:
                    self.report.partial[key] = '; '.join(
                        filter(None, [
                            self.report.partial.get(key),
                            f'{_ROLE_NAMES[role]} rows {rows.start}:{rows.stop} new'
                        ]))
        for name in pola.state_dict():
            key = f'{path}.{name}'
            if key not in self.report.loaded:
                self.report.new[key] = 'Pola attention only'

    def rest(self, handled: Set[str]) -> None:
        """Every other backbone tensor: copied by name from the twin, or new."""
        for key, value in self.own.items():
            if key in handled:
                continue
            if key in self.from_file and self.twin[key].shape == value.shape:
                self.copy(key, None, key, None)
            else:
                self.report.new[key] = 'not in the file'

    def unused_file_keys(self) -> Dict[str, str]:
        """File keys none of whose tensors reached the backbone, with the reason."""
        used_files = {self.converted.origin[k][0] for k in self.used}
        used_files.update(p[2] for k in self.used for p in self.converted.pieces.get(k, ()))
        unused = {}
        for twin_key in self.converted.state_dict:  # in the file's order
            if twin_key not in self.from_file or twin_key in self.used:
                continue
            file_key = self.converted.origin[twin_key][0]
            if file_key not in used_files:
                why = self.twin_unused.get(twin_key, 'no counterpart in the Pola backbone')
                unused.setdefault(self.prefix + file_key, why)
        return unused


def warm_start(backbone: PolaBackboneBase,
               checkpoint: str,
               prefix: Optional[str] = None,
               log: bool = True) -> WarmStartReport:
    """Initialise the Pola ``backbone`` from a softmax ``checkpoint`` (see the module
    docstring): a fresh initialisation, then every tensor with the same meaning loaded.

    Args:
        backbone (PolaBackboneBase): A Pola backbone (PolaPVT, PolaSwin, ...).
        checkpoint (str): A softmax checkpoint of the backbone's family, in one of the
            layouts of :mod:`.layouts` (local path, URL or another mmengine scheme).
        prefix (str, optional): The prefix of the backbone's keys in the file; None
            takes ``'backbone.'`` when the keys carry it. Default: None.
        log (bool): Log the report through ``MMLogger`` (summary at INFO, one line per
            tensor at DEBUG). Default: True.

    Returns:
        WarmStartReport: what was loaded, what is new, what was left unused.

    Raises:
        WarmStartError: a file of another family or size, a Pola checkpoint, or an
            unknown layout.
    """
    backbone_family(backbone)
    source = str(checkpoint)
    state_dict, outside, prefix = read_softmax_checkpoint(checkpoint, prefix)
    layout = _choose_layout(state_dict, backbone, source)
    converted = layout.convert(state_dict)
    twin = softmax_twin(backbone)
    converted = fit_grids(twin, drop_outside(twin, converted))
    from_file, extra = load_twin(twin, converted, backbone, source, layout)
    refuse_non_finite(
        OrderedDict(
            (converted.origin[k][0], v) for k, v in converted.state_dict.items() if k in from_file),
        source, 'the warm start', prefix)
    fresh_init(backbone)

    report = WarmStartReport(describe(backbone), source, layout.name)
    transfer = _Transfer(backbone, twin, converted, from_file, prefix, report)
    handled = set()
    for path, module in backbone.named_modules():
        if isinstance(module, PolaLinearAttention):
            transfer.attention(path, module, twin.get_submodule(path))
            handled.update(f'{path}.{k}' for k in module.state_dict())
    transfer.rest(handled)
    order = {k: i for i, k in enumerate(transfer.own)}
    report.loaded = type(report.loaded)(sorted(report.loaded.items(), key=lambda kv: order[kv[0]]))
    report.unused.update({prefix + k: why for k, why in converted.dropped.items()})
    report.unused.update({prefix + k: why for k, why in extra.items()})
    report.unused.update(transfer.unused_file_keys())
    report.unused.update(outside)
    if log:
        logger = MMLogger.get_current_instance()
        logger.info(report.format())
        logger.debug(report.details())
    return report


def warm_start_from_cfg(backbone: PolaBackboneBase, init_cfg: dict) -> WarmStartReport:
    """``init_cfg=dict(type='WarmStart', checkpoint=..., prefix=...)`` of a Pola
    backbone; other keys are an error that names them."""
    unknown = sorted(set(init_cfg) - set(INIT_CFG_KEYS))
    if unknown:
        raise ValueError(f"init_cfg type='WarmStart' takes {list(INIT_CFG_KEYS)}; got unknown "
                         f'keys {unknown}')
    if not init_cfg.get('checkpoint'):
        raise ValueError("init_cfg type='WarmStart' needs a 'checkpoint' (a softmax "
                         'checkpoint of the backbone\'s family)')
    return warm_start(backbone, init_cfg['checkpoint'], prefix=init_cfg.get('prefix'))
