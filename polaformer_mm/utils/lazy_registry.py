"""Registry entries whose module is imported on first look-up.

A class whose module imports a heavy library (a backbone built on mmpretrain) should not
cost every ``import polaformer_mm`` that import, yet configs name it by ``type`` like any
other. :func:`register_lazily` notes the module of such a name in an mmengine
:class:`~mmengine.registry.Registry`; the first look-up of the name (``get``, ``build``,
``name in registry``, from this registry or any child that falls back to it, as mmdet's,
mmseg's and mmpretrain's do) imports the module, whose ``@register_module()`` registers
the class itself: ``registry.get(name)`` is the class, never a stand-in.

This module imports nothing of the package.
"""
import importlib
import sys
from typing import Dict

__all__ = ['LazyEntries', 'register_lazily', 'lazy_names']


class LazyEntries(dict):
    """A registry's name -> class dict that imports a noted module when one of its names
    is looked up before the module registered it.

    Args:
        entries (dict): The registry's entries so far.
    """

    def __init__(self, entries: dict):
        super().__init__(entries)
        #: name -> the module that registers it when imported
        self.pending: Dict[str, str] = {}

    def _load(self, key) -> None:
        module = self.pending.pop(key, None) if isinstance(key, str) else None
        if module is None or dict.__contains__(self, key) or module in sys.modules:
            return  # registered, or its module is importing (register_module looks it up)
        try:
            importlib.import_module(module)
        except ImportError as err:
            self.pending[key] = module  # the next look-up names the problem again
            raise ImportError(f'{key!r} is registered by {module}, which cannot be imported: '
                              f'{type(err).__name__}: {err}') from err
        if not dict.__contains__(self, key):
            raise KeyError(f'importing {module} did not register {key!r}, which was noted '
                           'as registered by it')

    def __contains__(self, key) -> bool:
        self._load(key)
        return super().__contains__(key)

    def __missing__(self, key):
        self._load(key)
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        raise KeyError(key)

    def get(self, key, default=None):
        """The entry of ``key`` (its module imported first if noted), else ``default``."""
        return self[key] if key in self else default


def register_lazily(registry, name: str, module: str) -> None:
    """Note that importing ``module`` registers ``name`` in ``registry``: the first
    look-up of ``name`` imports it. A name already registered is left as it is."""
    entries = registry._module_dict
    if not isinstance(entries, LazyEntries):
        entries = LazyEntries(entries)
        registry._module_dict = entries
    if not dict.__contains__(entries, name):
        entries.pending[name] = module


def lazy_names(registry) -> Dict[str, str]:
    """The names of ``registry`` whose module is not imported yet, with that module."""
    entries = registry._module_dict
    return dict(entries.pending) if isinstance(entries, LazyEntries) else {}
