"""No import circle in the package: no module of ``polaformer_mm`` imports a module that
imports it back, directly or through others.

The graph is read from the sources (no import runs): every ``import`` statement counts,
at module level and inside functions alike (an import deferred into a function still
ties the two modules together); relative imports are resolved; ``from pkg import name``
is an edge to ``pkg.name`` when that is a module of the package, else to ``pkg``. The
implicit import of a module's parent packages is no edge (``polaformer_mm.models.utils``
runs ``polaformer_mm/models/__init__.py`` first, but does not depend on it)."""
import ast
import glob
import os.path as osp
from typing import Dict, List, Set

from tests import REPO

PACKAGE = 'polaformer_mm'


def _modules() -> Dict[str, str]:
    """Dotted name -> path of every module of the package."""
    found = {}
    for path in sorted(glob.glob(osp.join(REPO, PACKAGE, '**', '*.py'), recursive=True)):
        rel = osp.relpath(path, REPO)
        if any(part.startswith('.') for part in rel.split(osp.sep)):
            continue
        parts = rel[:-len('.py')].split(osp.sep)
        if parts[-1] == '__init__':
            parts = parts[:-1]
        found['.'.join(parts)] = path
    return found


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name ``from <...> import`` names (a relative one resolved)."""
    if not node.level:
        return node.module
    anchor = module.split('.') if is_package else module.split('.')[:-1]
    anchor = anchor[:len(anchor) - (node.level - 1)]
    return '.'.join(anchor + ([node.module] if node.module else []))


def _package_module(name: str, modules) -> str:
    """``name`` or its longest prefix that is a module of the package (None outside)."""
    while name and name not in modules:
        name = name.rpartition('.')[0]
    return name or None


def _imports(module: str, path: str, modules) -> Set[str]:
    """The modules of the package that ``module`` imports anywhere in its source."""
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    is_package = osp.basename(path) == '__init__.py'
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(_package_module(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            for alias in node.names:
                full = f'{base}.{alias.name}'
                targets.add(full if full in modules else _package_module(base, modules))
    targets.discard(None)
    targets.discard(module)
    return targets


def import_graph() -> Dict[str, Set[str]]:
    """Module -> the modules of the package it imports."""
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of ``graph`` (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return found


def _cycle(component: List[str], graph) -> List[str]:
    """One import cycle through the members of ``component`` (breadth-first from its
    first member back to it), as the modules in order."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & members):
            if child == start:
                return paths[node] + [start]
            if child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    return component


def test_the_package_has_no_import_circle():
    graph = import_graph()
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not circles, 'import circles (each a chain of imports that comes back):\n' + '\n'.join(
        ' -> '.join(_cycle(c, graph)) for c in circles)


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert len(graph) > 40 and 'polaformer_mm' in graph and 'polaformer_mm.models' in graph
    # module level, relative, ``from pkg import module``
    assert 'polaformer_mm.engine' in graph['polaformer_mm']
    assert 'polaformer_mm.models.backbones.base' in graph['polaformer_mm.models.warm_start.core']
    # inside a function: base.py loads official checkpoints through official_weights
    assert 'polaformer_mm.models.official_weights' in graph['polaformer_mm.models.backbones.base']
    # ``from pkg import name`` of a name that is no module: an edge to the package
    assert 'polaformer_mm.models.backbones' in graph['polaformer_mm.models']
    assert 'polaformer_mm.models' not in graph['polaformer_mm.models.attention']


def test_the_search_finds_a_circle_and_names_it():
    graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a', 'd'}, 'd': set(), 'e': {'e'}}
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert circles == [['a', 'b', 'c']]
    assert _cycle(circles[0], graph) == ['a', 'b', 'c', 'a']
    assert [c for c in strongly_connected({'a': {'b'}, 'b': set()}) if len(c) > 1] == []
