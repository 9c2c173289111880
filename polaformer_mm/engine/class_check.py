"""Heads whose class counts disagree with the data's classes, named before a run starts.

A head predicting more or fewer classes than the dataset holds builds fine and fails deep
in the loss (``IndexError: index 2 is out of bounds``, ``Target 13 is out of bounds``) or,
with more classes than the data, only after a whole epoch in the metric.
:func:`check_num_classes` works from the config alone:

* **The data's classes** (:func:`dataset_classes`): the dataset config's
  ``metainfo.classes``, else the ``METAINFO`` of its type, looked up in the registry of the
  scope that builds it (the type's prefix such as ``mmdet.CocoDataset``, else the config's
  ``_scope_`` / ``default_scope``: ``mmdet.registry.DATASETS``, ``mmseg.registry.DATASETS``,
  ``mmpretrain.registry.DATASETS``); metainfo given in the config updates the type's, as
  mmengine's ``BaseDataset`` does. Wrappers are looked into (``dataset`` of
  ``RepeatDataset`` / ``ClassBalancedDataset`` / ``MultiImageMixDataset``, every one of a
  ``ConcatDataset``'s ``datasets``). Panoptic data (``thing_classes`` and ``stuff_classes``)
  keeps its split; other data is all things.
* **The model's class settings** (:func:`class_settings`): every ``num_classes``,
  ``num_things_classes`` and ``num_stuff_classes`` under ``model`` (also one a head's type
  sets by default when the config leaves it out), the ``class_weight`` lists of their
  losses (one weight per class, plus the "no object" weight where the config has one), and
  the ``data_preprocessor.num_classes`` of classifiers (their one-hot labels). The backbone
  and the class-agnostic proposal heads (mmdet's ``NumClassCheckHook`` rule) are left out.
  Keys are the config's own, in ``--cfg-options`` form: Cascade's per-stage
  ``model.roi_head.bbox_head.0.num_classes``, its one ``model.roi_head.mask_head.num_classes``,
  Mask2Former's ``model.panoptic_head.num_things_classes`` /
  ``model.panoptic_fusion_head.num_stuff_classes``.

A mismatch is a :class:`ClassMismatchError` naming every wrong key, the data's classes and
where they come from, and the ``key=value`` settings that fit the data (``settings``):
given to ``--cfg-options`` (or written into the config), they pass the check. An mmseg
dataset that names no classes (no ``metainfo.classes``, none in its type's ``METAINFO``)
is checked against its maps: the largest label of a sample of them (64, spread over the
dataset; ``ignore_index`` left out) must be below every ``num_classes``. Other datasets
whose classes are only known once they are read (e.g. mmpretrain's ``CustomDataset`` over
class folders) are not checked. A class count that is not an int (``num_classes='four'``)
is named by :func:`check_count_types`, which the runner calls before it builds the model.
"""
import importlib
import inspect
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch.nn as nn

from .checkpoint_fit import unwrap
from .model_check import ModelConfigError

# heads with a num_classes that is not the data's (proposal heads are class-agnostic)
_SKIPPED = ('RPNHead', 'GARPNHead', 'StageCascadeRPNHead', 'CascadeRPNHead', 'FusedSemanticHead')
_COUNTS = ('num_classes', 'num_things_classes', 'num_stuff_classes')
_WRAPPER_LISTS = ('datasets', )


class ClassMismatchError(ModelConfigError):
    """Class counts of the model that differ from the data's; ``settings`` maps each config
    key (``--cfg-options`` form) to the value that fits the data."""

    def __init__(self, message: str, settings: Dict[str, object]):
        super().__init__(message)
        self.settings = settings


class DataClasses(NamedTuple):
    """The classes of one dataset a split reads.

    Attributes:
        key: the dataset's config key, e.g. ``train_dataloader.dataset.dataset``.
        classes: its class names.
        source: where they come from (the config key with ``=``, or the type's ``METAINFO``),
            to be followed by the classes.
        things: the thing classes of panoptic data, else None (all are things).
        stuff: the stuff classes of panoptic data, else None.
        from_config: whether the classes are the config's ``metainfo.classes``.
    """
    key: str
    classes: tuple
    source: str
    things: Optional[tuple]
    stuff: Optional[tuple]
    from_config: bool


class ClassSetting(NamedTuple):
    """One setting of the model config that must fit the data's classes.

    Attributes:
        key: its config key in ``--cfg-options`` form.
        value: its value (an int, or the list of a ``class_weight``).
        role: ``'classes'``, ``'things'``, ``'stuff'`` or ``'weights'``.
        owner: the type of the dict it belongs to.
        explicit: False for a count the config leaves to the type's default.
        extra: for ``'weights'``: the entries after the per-class ones ("no object").
    """
    key: str
    value: object
    role: str
    owner: str
    explicit: bool = True
    extra: int = 0


# -- registries ------------------------------------------------------------------------
def _registry(scope: Optional[str], name: str):
    if scope:
        try:
            return getattr(importlib.import_module(f'{scope}.registry'), name)
        except (ImportError, AttributeError):
            pass
    return getattr(importlib.import_module('mmengine.registry'), name)


def _lookup(kind, scope: Optional[str], name: str):
    """The class of a config ``type`` (a class, or a name looked up in the registry of its
    scope); None when unknown."""
    if not isinstance(kind, str):
        return kind if isinstance(kind, type) else None
    if '.' in kind:
        scope = kind.split('.', 1)[0]
    try:
        return _registry(scope, name).get(kind)
    except Exception:  # an unknown type is the builder's error to raise
        return None


def _type_name(kind) -> str:
    if isinstance(kind, str):
        return kind.rsplit('.', 1)[-1]
    return getattr(kind, '__name__', str(kind))


# -- the data --------------------------------------------------------------------------
def _leaves(node, key: str, scope: Optional[str]):
    if not isinstance(node, dict):
        return
    scope = node.get('_scope_', scope)
    inner = node.get('dataset')
    if isinstance(inner, dict):
        yield from _leaves(inner, f'{key}.dataset', scope)
        return
    for name in _WRAPPER_LISTS:
        parts = node.get(name)
        if isinstance(parts, (list, tuple)) and parts and all(isinstance(p, dict) for p in parts):
            for i, part in enumerate(parts):
                yield from _leaves(part, f'{key}.{name}.{i}', scope)
            return
    yield node, key, scope


def _data_classes(node: dict, key: str, scope: Optional[str]) -> Optional[DataClasses]:
    given = dict(node.get('metainfo') or {})
    kind = node.get('type')
    cls = _lookup(kind, scope, 'DATASETS')
    metainfo = dict(getattr(cls, 'METAINFO', None) or {})
    metainfo.update(given)  # as mmengine's BaseDataset._load_metainfo
    classes = metainfo.get('classes')
    if not classes or isinstance(classes, str):
        return None
    classes = tuple(classes)
    if given.get('classes') is not None:
        source, from_config = f'{key}.metainfo.classes=', True
    else:
        source, from_config = f'the METAINFO of {key}.type={_type_name(kind)}: ', False
    things, stuff = metainfo.get('thing_classes'), metainfo.get('stuff_classes')
    if things is None or stuff is None or len(things) + len(stuff) != len(classes):
        things = stuff = None
    else:
        things, stuff = tuple(things), tuple(stuff)
    return DataClasses(key, classes, source, things, stuff, from_config)


def dataset_classes(cfg, split: str) -> List[DataClasses]:
    """The classes of every dataset ``{split}_dataloader`` reads (wrappers looked into);
    datasets whose classes the config and the registry do not tell are left out."""
    loader = cfg.get(f'{split}_dataloader')
    dataset = loader.get('dataset') if isinstance(loader, dict) else None
    found = []
    for node, key, scope in _leaves(dataset, f'{split}_dataloader.dataset',
                                    cfg.get('default_scope')):
        data = _data_classes(node, key, scope)
        if data is not None:
            found.append(data)
    return found


# -- the model -------------------------------------------------------------------------
def _defaults(cls) -> Dict[str, int]:
    """The int defaults of the class counts the constructor of ``cls`` takes (followed
    through ``**kwargs`` to the parent that declares them)."""
    for klass in getattr(cls, '__mro__', ()):
        if '__init__' not in vars(klass):
            continue
        try:
            params = inspect.signature(vars(klass)['__init__']).parameters
        except (TypeError, ValueError):
            return {}
        declared = [p for p in params.values() if p.name in _COUNTS]
        if declared:
            return {
                p.name: p.default
                for p in declared if isinstance(p.default, int) and not isinstance(p.default, bool)
            }
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return {}
    return {}


class _Head(NamedTuple):
    """The class counts of the nearest dict above a loss, and how many entries its
    ``class_weight`` has beyond one per class (None: not known from its type)."""
    counts: List[ClassSetting]
    extra: Optional[int]


# heads whose classification has one more output than classes ("no object" for
# MaskFormer / Mask2Former, background for mmdet's RoI box heads): their loss's
# class_weight has num_classes + 1 entries
_EXTRA_CLASS_HEADS = ('MaskFormerHead', 'Mask2FormerHead', 'BBoxHead')


def _extra_weights(cls) -> Optional[int]:
    """The class weights a head type takes beyond one per class: 1 for the heads of
    :data:`_EXTRA_CLASS_HEADS` and their subclasses, 0 for any other known type, None when
    the type is unknown."""
    if not isinstance(cls, type):
        return None
    names = {klass.__name__ for klass in cls.__mro__}
    return 1 if names & set(_EXTRA_CLASS_HEADS) else 0


def _walk(node, key: str, scope: Optional[str], head: Optional[_Head],
          out: List[ClassSetting]) -> None:
    if isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            _walk(item, f'{key}.{i}', scope, head, out)
        return
    if not isinstance(node, dict):
        return
    scope = node.get('_scope_', scope)
    kind = node.get('type')
    owner = _type_name(kind) if kind is not None else key.rsplit('.', 1)[-1]
    if owner in _SKIPPED:
        return
    counts = []
    for name in _COUNTS:
        value = node.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            counts.append(ClassSetting(f'{key}.{name}', value, _ROLE[name], owner))
    if kind is not None:
        for name, value in _defaults(_lookup(kind, scope, 'MODELS')).items():
            if name not in node:
                counts.append(ClassSetting(f'{key}.{name}', value, _ROLE[name], owner, False))
    if counts:
        out.extend(counts)
        head = _Head(counts, _extra_weights(_lookup(kind, scope, 'MODELS')))
    weights = node.get('class_weight')
    if head is not None and isinstance(weights, (list, tuple)) and weights:
        out.append(_weights_setting(f'{key}.class_weight', list(weights), head))
    for name, value in node.items():
        if name in ('backbone', 'class_weight', '_scope_') or name in _COUNTS:
            continue
        _walk(value, f'{key}.{name}', scope, head, out)


_ROLE = {'num_classes': 'classes', 'num_things_classes': 'things', 'num_stuff_classes': 'stuff'}


def _weights_setting(key: str, weights: list, head: _Head) -> ClassSetting:
    counts = head.counts
    owner = counts[0].owner
    extra = head.extra
    if extra is None:  # a type not known: from the lengths, as the config has them
        configured = sum(s.value for s in counts if s.role in ('things', 'stuff'))
        configured = configured or next((s.value for s in counts if s.role == 'classes'), 0)
        extra = len(weights) - configured
        if extra not in (0, 1):  # the count was changed alone: what the type's name says
            extra = 1 if any(name in owner for name in _EXTRA_CLASS_HEADS) else 0
    return ClassSetting(key, weights, 'weights', owner, True, min(extra, len(weights)))


def class_settings(cfg) -> List[ClassSetting]:
    """Every setting of ``cfg.model`` (and of a top-level ``data_preprocessor`` the runner
    merges into it) that must fit the data's classes; see the module docstring."""
    model = cfg.get('model')
    if not isinstance(model, dict):
        return []
    scope = cfg.get('default_scope')
    out: List[ClassSetting] = []
    _walk(model, 'model', scope, None, out)
    preprocessor = cfg.get('data_preprocessor')
    if 'data_preprocessor' not in model and isinstance(preprocessor, dict):
        value = preprocessor.get('num_classes')
        if isinstance(value, int) and not isinstance(value, bool):
            out.append(
                ClassSetting('data_preprocessor.num_classes', value, 'classes',
                             _type_name(preprocessor.get('type', 'data_preprocessor'))))
    return out


# -- the comparison --------------------------------------------------------------------
def _expected(setting: ClassSetting, data: DataClasses) -> object:
    """The value of ``setting`` that fits ``data``."""
    n = len(data.classes)
    things = len(data.things) if data.things is not None else n
    stuff = len(data.stuff) if data.stuff is not None else 0
    if setting.role == 'classes':
        return n
    if setting.role == 'things':
        return things
    if setting.role == 'stuff':
        return stuff
    weights, extra = setting.value, setting.extra
    per_class = weights[:len(weights) - extra]
    tail = weights[len(weights) - extra:]
    if per_class and all(w == per_class[0] for w in per_class):
        new = [per_class[0]] * n
    else:
        new = list(per_class[:n]) + [1.0] * max(0, n - len(per_class))
    return new + list(tail)


def _short(classes: Sequence) -> str:
    shown = ', '.join(repr(c if len(str(c)) <= 24 else str(c)[:21] + '...') for c in classes[:4])
    return f'({shown}{", ..." if len(classes) > 4 else ""})'


def _cli(value) -> str:
    if isinstance(value, (list, tuple)):
        return '[' + ','.join(_cli(v) for v in value) + ']'
    return repr(value)


def _shown(setting: ClassSetting) -> str:
    if setting.role == 'weights':
        return f'{setting.key} has {len(setting.value)} values'
    if not setting.explicit:
        return f'{setting.key}={setting.value} (not set: the default of {setting.owner})'
    return f'{setting.key}={setting.value}'


def _data_text(data: DataClasses) -> str:
    text = f'{len(data.classes)} classes ({data.source}{_short(data.classes)}'
    if data.things is not None:
        text += f'; {len(data.things)} things, {len(data.stuff)} stuff'
    return text + ')'


def _mismatch(split: str, data: DataClasses,
              settings: Sequence[ClassSetting]) -> Optional[ClassMismatchError]:
    wrong = []
    for setting in settings:
        value = _expected(setting, data)
        if value is not None and value != setting.value:
            wrong.append((setting, value))
    if not wrong:
        return None
    fixes = {s.key: v for s, v in wrong}
    listed = '; '.join(_shown(s) for s, _ in wrong)
    advice = ' '.join(f'{k}={_cli(v)}' for k, v in fixes.items())
    message = (f'{listed}; but the {split} data has {_data_text(data)}: to train on this data, '
               f'set {advice} (--cfg-options takes these as written)')
    counts = {s.value for s in settings if s.role == 'classes'}
    n = counts.pop() if len(counts) == 1 else None
    fits_n = n is not None and not any(s.role in ('things', 'stuff') for s in settings) and all(
        _expected(s, data._replace(classes=(None, ) * n)) == s.value for s in settings)
    if fits_n:  # the model fits data of n classes as it is
        message += (f'; or, for data of {n} classes, name them in {data.key}.metainfo.classes '
                    f'(in place of {len(data.classes)})')
    return ClassMismatchError(message, fixes)


def _module_heads(model: nn.Module) -> List[Tuple[str, int]]:
    found, taken = [], []
    for name, module in unwrap(model).named_modules():
        n = getattr(module, 'num_classes', None)
        if not name or not isinstance(n, int) or isinstance(
                n, bool) or name.startswith('backbone') or any(
                    name.startswith(t + '.') for t in taken):
            continue
        taken.append(name)
        if type(module).__name__ not in _SKIPPED:
            found.append((name, n))
    return found


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad_counts(node, key: str, out: List[Tuple[str, object]]) -> None:
    if isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            _bad_counts(item, f'{key}.{i}', out)
        return
    if not isinstance(node, dict):
        return
    for name, value in node.items():
        if name in _COUNTS and value is not None and not _is_count(value):
            out.append((f'{key}.{name}', value))
        elif name != 'backbone':
            _bad_counts(value, f'{key}.{name}', out)


def check_count_types(cfg, splits: Sequence[str] = ('train', 'val', 'test')) -> None:
    """A :class:`ClassMismatchError` (a :class:`~.model_check.ModelConfigError` where no
    dataset of ``splits`` tells its classes) naming every class count of ``cfg.model``
    (and ``data_preprocessor.num_classes``) that is not an int, e.g. ``num_classes='four'``
    from ``--cfg-options``; run before the model is built, whose constructors fail on such
    values with messages that name neither the key nor the value."""
    bad: List[Tuple[str, object]] = []
    _bad_counts(cfg.get('model'), 'model', bad)
    preprocessor = cfg.get('data_preprocessor')
    if isinstance(preprocessor, dict) and not _is_count(preprocessor.get('num_classes', 0)):
        bad.append(('data_preprocessor.num_classes', preprocessor['num_classes']))
    if not bad:
        return
    listed = ', '.join(f'{k}={v!r}' for k, v in bad)
    found = [d for split in splits for d in dataset_classes(cfg, split)]
    what = f'{listed}: a class count is a whole number'
    if not found:
        raise ModelConfigError(f'{what} (e.g. {bad[0][0]}=4)')
    data = found[0]
    fixes = {}
    for k, _ in bad:
        role = _ROLE.get(k.rsplit('.', 1)[-1], 'classes')
        fixes[k] = _expected(ClassSetting(k, 0, role, ''), data)
    advice = ' '.join(f'{k}={_cli(v)}' for k, v in fixes.items())
    raise ClassMismatchError(
        f'{what}; the data of {data.key} has {_data_text(data)}: to train on this data, set '
        f'{advice} (--cfg-options takes these as written)', fixes)


def _unnamed_seg_data(cfg, split: str):
    """(config key, type name, dataset config, class) of every mmseg dataset of
    ``{split}_dataloader`` whose classes neither the config nor its type names."""
    loader = cfg.get(f'{split}_dataloader')
    dataset = loader.get('dataset') if isinstance(loader, dict) else None
    try:
        from mmseg.datasets import BaseSegDataset
    except ImportError:
        return
    for node, key, scope in _leaves(dataset, f'{split}_dataloader.dataset',
                                    cfg.get('default_scope')):
        cls = _lookup(node.get('type'), scope, 'DATASETS')
        if (isinstance(cls, type) and issubclass(cls, BaseSegDataset)
                and _data_classes(node, key, scope) is None):
            yield key, _type_name(node.get('type')), node, cls


def _label_mismatch(split: str, key: str, kind: str, largest: tuple,
                    settings: Sequence[ClassSetting]) -> Optional[ClassMismatchError]:
    """The error for class settings of a segmentor that cannot take the largest label
    of its maps (a dataset that names no classes), None when they can."""
    label, path, read = largest
    needed = label + 1
    data = DataClasses(key, (None, ) * needed, '', None, None, False)
    wrong = []
    for setting in settings:
        if setting.role == 'classes' and setting.value < needed:
            wrong.append((setting, needed))
        elif setting.role == 'weights' and len(setting.value) - setting.extra < needed:
            wrong.append((setting, _expected(setting, data)))
    if not wrong:
        return None
    fixes = {s.key: v for s, v in wrong}
    listed = '; '.join(_shown(s) for s, _ in wrong)
    advice = ' '.join(f'{k}={_cli(v)}' for k, v in fixes.items())
    return ClassMismatchError(
        f'{listed}; but the maps of the {split} data ({key}: {kind}, which names no classes) '
        f'hold labels up to {label} ({path}; {read} maps read): to train on this data, set '
        f'{advice} (--cfg-options takes these as written); or name its classes, one per '
        f'label, in {key}.metainfo.classes', fixes)


def check_config_classes(cfg, splits: Sequence[str] = ('train', 'val')) -> None:
    """A :class:`ClassMismatchError` when a class setting of ``cfg.model`` does not fit the
    classes of a dataset of ``splits`` (see the module docstring); the config and the
    registries only: no dataset file is read and no model is built."""
    check_count_types(cfg, splits)
    settings = class_settings(cfg)
    if not settings:
        return
    for split in splits:
        for data in dataset_classes(cfg, split):
            error = _mismatch(split, data, settings)
            if error is not None:
                raise error
        for key, kind, node, cls in _unnamed_seg_data(cfg, split):
            from .dataset_check import largest_seg_label
            largest = largest_seg_label(node, cls)
            error = None if largest is None else _label_mismatch(split, key, kind, largest,
                                                                 settings)
            if error is not None:
                raise error


def check_num_classes(model: nn.Module, cfg, splits: Sequence[str] = ('train', 'val')) -> None:
    """:func:`check_config_classes` for a runner's config; a runner built from a model
    object (no model config) has its modules' ``num_classes`` compared instead."""
    if isinstance(cfg.get('model'), dict):
        check_config_classes(cfg, splits)
        return
    heads = _module_heads(model)
    for split in splits:
        for data in dataset_classes(cfg, split):
            wrong = [(k, n) for k, n in heads if n != len(data.classes)]
            if wrong:
                listed = ', '.join(f'{k}.num_classes={n}' for k, n in wrong)
                raise ModelConfigError(
                    f'the model\'s modules {listed} but the {split} data has '
                    f'{_data_text(data)}: build them with {len(data.classes)} classes')
