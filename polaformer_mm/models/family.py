"""Backbone families: everything the package knows about a family, declared beside its
backbone class, and the registry the tools iterate over.

A family is a Pola backbone class and its upstream relatives: the softmax checkpoints it
warm-starts from, the softmax backbone it is benchmarked against, how its configs are
named, which reproduce tasks it takes part in, where its attention modules sit. The
family's module fills one :class:`BackboneFamily` and registers it with
:func:`register_family`; the warm start (:mod:`polaformer_mm.models.warm_start`),
``benchmark_backbone`` (:mod:`polaformer_mm.analysis.benchmark`), the gain table, the
attention analysis and the reproduce kit read the registry (:func:`families`,
:func:`family_of`) and name no family themselves. docs/notes/developer_guide.md
("Adding a backbone family") walks through a new one.

This module imports nothing of the package, so that every family module and every tool
can import it.
"""
import importlib
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Pattern, Sequence, Tuple, Union

__all__ = [
    'BackboneFamily', 'register_family', 'register_family_module', 'unregister_family', 'families',
    'family_of', 'family_named', 'config_set'
]


def _no_backbones() -> Dict[str, dict]:
    return {}


@dataclass(frozen=True)
class BackboneFamily:
    """What the package knows about one backbone family.

    Args:
        name (str): The family's key, e.g. ``'pvt'``: the value of the backbone class's
            ``family`` attribute.
        title (str): The family in messages, e.g. ``'PVT v1'``.
        backbone (type): The Pola backbone class (subclasses belong to the family too).
        layouts (sequence): The key layouts of softmax checkpoints the warm start reads
            (:class:`~polaformer_mm.models.checkpoint_layouts.Layout`), the backbone's own
            (softmax twin) layout first.
        config_name (str): The family in config file names (``pola-<config_name>-<size>``).
        config_title (str): The family in the gain table's backbone labels.
        config_sizes (str): A regex of the sizes in config file names (what follows
            ``<config_name>-``), e.g. ``'[tsml]'``.
        config_size_suffix (str): What follows the size in config file names and is no
            part of it (``'16'``: a patch size), or ''.
        benchmark (callable): ``() -> {name: dict(scope, cfg, config)}``: the named
            backbones of ``benchmark_backbone.py``, each Pola one (``pola-X``) beside its
            softmax baseline (``X``), built in registry ``scope`` (None: the package's).
        reproduce (dict): reproduce task -> {``--arch`` name: config path under
            ``configs/``}: the family's Pola configs in each task of ``tools/reproduce.py``.
        attention_names (regex): Matches the module names of the family's Pola attention
            modules in a backbone, with the groups ``block`` and, for a backbone with
            several stages, ``stage``.
        read_release (callable, optional): ``state_dict -> state_dict or None``: a release
            file that ``init_cfg=dict(type='Pretrained')`` reads in the family's own way
            (None when the file is not one).
    """
    name: str
    title: str
    backbone: type
    layouts: Sequence = ()
    config_name: str = ''
    config_title: str = ''
    config_sizes: str = r'[a-z0-9]+'
    config_size_suffix: str = ''
    benchmark: Callable[[], Dict[str, dict]] = _no_backbones
    reproduce: Dict[str, Dict[str, str]] = field(default_factory=dict)
    attention_names: Union[str, Pattern, None] = None
    read_release: Optional[Callable] = None

    def __post_init__(self) -> None:
        """Check the fields that a family's users read first, naming the field and value."""
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f'BackboneFamily(name={self.name!r}): name takes a non-empty str, '
                            "the backbone class's family attribute, e.g. name='pvt'")
        if not isinstance(self.backbone, type):
            raise TypeError(
                f'BackboneFamily(name={self.name!r}, backbone={self.backbone!r}): backbone takes '
                'the Pola backbone class itself, not its name or an instance (e.g. '
                'from polaformer_mm.models import PolaPVT; backbone=PolaPVT)')
        if self.attention_names is not None:
            try:
                groups = re.compile(self.attention_names).groupindex
            except (re.error, TypeError) as err:
                raise ValueError(f'BackboneFamily(name={self.name!r}, attention_names='
                                 f'{self.attention_names!r}): not a regular expression '
                                 f'({err})') from None
            if 'block' not in groups:
                raise ValueError(f'BackboneFamily(name={self.name!r}, attention_names='
                                 f'{self.attention_names!r}): the regex needs a group '
                                 "(?P<block>...) for the block's index (and (?P<stage>...) "
                                 'for a backbone with several stages)')

    def config_pattern(self) -> Pattern:
        """``(pola-)?<config_name>-<size>`` as a word of a config file name; groups:
        ``pola``, ``size``."""
        return re.compile(rf'(?:^|_)(?P<pola>pola-)?{re.escape(self.config_name or self.name)}'
                          rf'-(?P<size>{self.config_sizes}){re.escape(self.config_size_suffix)}'
                          r'(?=[-_]|$)')

    def attention_site(self, name: str) -> Optional[Tuple[int, int]]:
        """(stage, block) of the attention module called ``name``, or None when the name is
        not one of the family's attention modules."""
        if self.attention_names is None:
            return None
        match = re.search(self.attention_names, name)
        if match is None:
            return None
        groups = match.groupdict()
        return int(groups.get('stage') or 0), int(groups['block'])


_FAMILIES: Dict[str, BackboneFamily] = {}
#: modules that register a family when imported, imported by :func:`families` first
_LAZY_MODULES: List[str] = []


def register_family_module(module: str) -> None:
    """Note that importing ``module`` registers a family, for a family whose module is not
    imported with the package (its backbone registered lazily because it imports a heavy
    library): :func:`families` imports it before listing the families."""
    if module not in _LAZY_MODULES:
        _LAZY_MODULES.append(module)


def _import_lazy_modules() -> None:
    for module in list(_LAZY_MODULES):
        importlib.import_module(module)


def _qualified(cls: type) -> str:
    return f'{cls.__module__}.{cls.__qualname__}'


def _reproduce_clashes(family: BackboneFamily) -> List[str]:
    """The reproduce ``--arch`` names of ``family`` that another registered family gives
    the same task."""
    clashes = []
    for other in _FAMILIES.values():
        if other.name == family.name:
            continue
        for task, configs in family.reproduce.items():
            for arch in configs:
                if arch in other.reproduce.get(task, {}):
                    clashes.append(f"--arch {arch} of task {task!r} (family {other.name!r})")
    return clashes


def register_family(family: BackboneFamily) -> BackboneFamily:
    """Register ``family``. The backbone class must carry the family's name in its
    ``family`` attribute. A name registered for another backbone class is refused (a
    subclass inherits its parent's ``family``: it needs a name of its own), as are config
    names and reproduce ``--arch`` names another family has; the same class registered
    again (a reloaded module) replaces its entry.

    Returns:
        BackboneFamily: ``family``.
    """
    if not isinstance(family, BackboneFamily):
        raise TypeError(f'register_family takes a BackboneFamily, got {type(family).__name__}')
    cls = family.backbone
    if getattr(cls, 'family', None) != family.name:
        raise ValueError(f'{cls.__name__}.family is '
                         f'{getattr(cls, "family", None)!r}, but the family '
                         f'registered for it is {family.name!r}')
    taken = _FAMILIES.get(family.name)
    if taken is not None and _qualified(taken.backbone) != _qualified(cls):
        inherited = 'family' not in vars(cls)
        raise ValueError(
            f'register_family: the family name {family.name!r} is taken by '
            f'{_qualified(taken.backbone)} ({taken.title}); {cls.__name__}.family is '
            f'{family.name!r}' + (' (inherited from its parent class)' if inherited else '')
            + f'. Give {cls.__name__} a family name of its own (class attribute family = '
            "'<name>') and register BackboneFamily(name='<name>', ...) under it")
    config_name = family.config_name or family.name
    for other in _FAMILIES.values():
        if other.name != family.name and (other.config_name or other.name) == config_name:
            raise ValueError(f'register_family({family.name!r}): config_name {config_name!r} '
                             f'is that of the family {other.name!r}; config files could not '
                             'tell the two apart: give it a config_name of its own')
    clashes = _reproduce_clashes(family)
    if clashes:
        raise ValueError(f'register_family({family.name!r}): {", ".join(clashes)} already '
                         'taken by another family: give its reproduce configs other --arch '
                         'names')
    _FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> BackboneFamily:
    """Remove the family registered as ``name`` (a family defined for a while only, e.g.
    in a test); a KeyError naming the registered ones when there is none.

    Returns:
        BackboneFamily: the removed family.
    """
    family = family_named(name)
    del _FAMILIES[name]
    return family


def families() -> List[BackboneFamily]:
    """Every registered family, in registration order (the modules noted with
    :func:`register_family_module` imported first)."""
    _import_lazy_modules()
    return list(_FAMILIES.values())


def family_named(name: str) -> BackboneFamily:
    """The family registered as ``name``; a KeyError naming the registered ones."""
    if name not in _FAMILIES:
        _import_lazy_modules()
    if name not in _FAMILIES:
        raise KeyError(f'no backbone family {name!r}; registered: {", ".join(_FAMILIES)}')
    return _FAMILIES[name]


def family_of(backbone) -> Optional[BackboneFamily]:
    """The family of a backbone (an instance or a class): the registered family of the
    nearest class in its MRO that is a family's backbone class; None for any other."""
    cls = backbone if isinstance(backbone, type) else type(backbone)
    for base in cls.__mro__:
        for family in _FAMILIES.values():
            if family.backbone is base:
                return family
    return None


def config_set(folder: str, pattern: str, sizes: Sequence[str], name: str) -> Dict[str, str]:
    """``{'<name>-<size>': '<folder>/<pattern with the size>'}`` for every size: a family's
    configs of one reproduce task (``BackboneFamily.reproduce``)."""
    return {f'{name}-{size}': f'{folder}/{pattern.format(size)}' for size in sizes}
