"""Lazily registered names (:mod:`polaformer_mm.utils.lazy_registry`): the first look-up
imports the module, which registers the class itself; PolaViT is registered so, and
``import polaformer_mm`` still imports no mmpretrain; every entry the package registers
is a class."""
import sys
import types

import pytest
from mmengine.registry import Registry

from polaformer_mm.utils.lazy_registry import lazy_names, register_lazily
from .._fresh_python import fresh_python_json

TOY_MODULE = '''
from lazy_registry_toys import REGISTRY


@REGISTRY.register_module()
class Toy:
    def __init__(self, size=1):
        self.size = size
'''


@pytest.fixture
def toys(tmp_path, monkeypatch):
    """A root registry, a child that falls back to it, and toy modules on the path."""
    root = Registry('toys')
    child = Registry('toys', parent=root, scope='toy_child')
    holder = types.ModuleType('lazy_registry_toys')
    holder.REGISTRY = root
    monkeypatch.setitem(sys.modules, 'lazy_registry_toys', holder)
    (tmp_path / 'lazy_toy.py').write_text(TOY_MODULE)
    (tmp_path / 'lazy_toy_silent.py').write_text('X = 1\n')
    (tmp_path / 'lazy_toy_broken.py').write_text('import a_module_that_is_not_installed\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ('lazy_toy', 'lazy_toy_silent', 'lazy_toy_broken'):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return root, child


def test_the_first_look_up_imports_the_module_that_registers_the_class(toys):
    root, child = toys
    register_lazily(root, 'Toy', 'lazy_toy')
    assert 'lazy_toy' not in sys.modules
    assert lazy_names(root) == {'Toy': 'lazy_toy'}
    # a child registry falls back to its parent's entries
    toy = child.get('Toy')
    assert 'lazy_toy' in sys.modules
    assert isinstance(toy, type) and toy is sys.modules['lazy_toy'].Toy
    assert root.get('Toy') is toy and 'Toy' in root and lazy_names(root) == {}
    assert child.build(dict(type='Toy', size=3)).size == 3
    # other names are looked up as before
    assert root.get('Other') is None and 'Other' not in root


def test_the_module_imported_before_any_look_up_registers_as_usual(toys):
    root, _ = toys
    register_lazily(root, 'Toy', 'lazy_toy')
    import lazy_toy  # its register_module() looks the name up while the module is importing
    assert root.get('Toy') is lazy_toy.Toy and lazy_names(root) == {}


def test_a_name_registered_before_is_left_as_it_is(toys):
    root, _ = toys

    @root.register_module()
    class Toy:
        pass

    register_lazily(root, 'Toy', 'lazy_toy')
    assert lazy_names(root) == {}
    assert root.get('Toy') is Toy and 'lazy_toy' not in sys.modules


def test_a_module_that_cannot_be_imported_or_registers_nothing_is_named(toys):
    root, _ = toys
    register_lazily(root, 'Broken', 'lazy_toy_broken')
    for _ in range(2):  # named again on the next look-up
        with pytest.raises(
                ImportError,
                match="'Broken' is registered by lazy_toy_broken, which cannot be "
                'imported: ModuleNotFoundError'):
            root.get('Broken')
    register_lazily(root, 'Silent', 'lazy_toy_silent')
    with pytest.raises(KeyError, match="importing lazy_toy_silent did not register 'Silent'"):
        root.build(dict(type='Silent'))


def test_every_entry_the_package_registers_is_a_class():
    import mmengine.registry as registries

    import polaformer_mm  # noqa: F401
    entries = [(name, key, value) for name, registry in vars(registries).items()
               if isinstance(registry, Registry) for key, value in registry.module_dict.items()
               if getattr(value, '__module__', '').startswith('polaformer_mm')]
    assert {key for _, key, _ in entries} >= {'PolaPVT', 'PolaSwin', 'WarmStart', 'PolaRunner'}
    assert [(n, k) for n, k, v in entries if not isinstance(v, type)] == []


SCRIPT = r'''
import json, sys
import polaformer_mm
from mmengine.registry import MODELS
from polaformer_mm.utils.lazy_registry import lazy_names
pending = lazy_names(MODELS)
imported = 'mmpretrain' in sys.modules
from mmseg.registry import MODELS as SEG
via_mmseg = SEG.get('PolaViT')
from polaformer_mm.models.backbones.pola_vit import PolaViT
print('@@vit ' + json.dumps(dict(
    pending=pending, mmpretrain_before=imported, via_mmseg=via_mmseg is PolaViT,
    root=MODELS.get('PolaViT') is PolaViT, is_class=isinstance(MODELS.get('PolaViT'), type),
    attribute=polaformer_mm.models.PolaViT is PolaViT)))
'''


@pytest.mark.slow
def test_pola_vit_is_registered_on_first_look_up():
    found = fresh_python_json(SCRIPT, '@@vit')
    assert found == dict(
        pending={'PolaViT': 'polaformer_mm.models.backbones.pola_vit'},
        mmpretrain_before=False,
        via_mmseg=True,
        root=True,
        is_class=True,
        attribute=True)
