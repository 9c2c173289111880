"""A backbone family is one module: PVTv2 and DeiT / ViT, the families added after the
first two, are named in at most three files of the package (the family's module, the
backbones' ``__init__`` that imports it, and the package's public re-export); every tool
reads them from the family registry (docs/notes/developer_guide.md, "Adding a backbone
family")."""
import os
import os.path as osp
import re

import pytest

PACKAGE = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'polaformer_mm')

#: family -> (its words, the files allowed to name it)
FAMILIES = {
    'pvtv2': (r'pvtv2', {'models/backbones/pola_pvtv2.py'}),
    'vit': (r'deit|vit', {'models/backbones/pola_vit.py'}),
}
SHARED = {'models/backbones/__init__.py', 'models/__init__.py'}


def _package_files():
    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if not d.startswith('.') and d != '__pycache__']
        for name in files:
            if name.endswith('.py'):
                path = osp.join(root, name)
                yield osp.relpath(path, PACKAGE).replace(os.sep, '/'), path


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_a_family_is_named_in_its_module_and_the_imports_only(family):
    words, own = FAMILIES[family]
    naming = set()
    for rel, path in _package_files():
        with open(path, encoding='utf-8') as f:
            if re.search(words, f.read(), flags=re.IGNORECASE):
                naming.add(rel)
    assert own <= naming, f'{family}: its module no longer names it: {sorted(own - naming)}'
    assert naming <= own | SHARED, (
        f'{family} ({words!r}) is named outside its module and the imports: '
        f'{sorted(naming - own - SHARED)}; declare it in its BackboneFamily instead')
    assert len(naming) <= 3
