"""No function of the package or of the tools is longer than 80 lines, counted from its
``def`` line to its last line (docstring included): a longer one is split into named
pieces. Nested functions and methods are measured on their own, and also count in the
lines of the function around them."""
import ast
import glob
import os.path as osp

from tests import REPO

ROOTS = ('polaformer_mm', 'tools')
MAX_LINES = 80


def _sources():
    """The Python files under ROOTS (hidden folders, such as an installed .mim, left out)."""
    for root in ROOTS:
        for path in sorted(glob.glob(osp.join(REPO, root, '**', '*.py'), recursive=True)):
            rel = osp.relpath(path, REPO)
            if not any(part.startswith('.') for part in rel.split(osp.sep)):
                yield rel


def _functions(node, prefix=''):
    """(qualified name, first line, length in lines) of every function under ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + child.name
            yield name, child.lineno, child.end_lineno - child.lineno + 1
            yield from _functions(child, name + '.')
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, prefix + child.name + '.')
        else:  # functions defined inside if / try / with blocks
            yield from _functions(child, prefix)


def _lengths():
    for rel in _sources():
        with open(osp.join(REPO, rel)) as f:
            tree = ast.parse(f.read(), filename=rel)
        for name, line, length in _functions(tree):
            yield rel, name, line, length


def test_no_function_is_longer_than_80_lines():
    too_long = []
    for rel, name, line, length in _lengths():
        if length > MAX_LINES:
            too_long.append(f'{rel}:{line} {name}: {length} lines')
    assert not too_long, (f'functions longer than {MAX_LINES} lines (split them into named '
                          'pieces):\n' + '\n'.join(too_long))


def test_the_scan_measures_functions_methods_and_tools():
    found = {(rel, name): length for rel, name, _, length in _lengths()}
    # methods by their class, the tools' scripts, nested functions by their parent
    assert ('polaformer_mm/models/backbones/pola_swin.py', 'PolaSwin.__init__') in found
    assert ('tools/train.py', 'main') in found
    assert any('.' in name and not name.split('.')[0][:1].isupper() for _, name in found)
    assert len({rel for rel, _ in found}) > 40
    # the def line to the last line, docstring included
    tree = ast.parse('def f(x):\n    """Doc\n    string."""\n    return x\n')
    assert list(_functions(tree)) == [('f', 1, 4)]
