"""The public API: what ``import polaformer_mm`` exports and registers, what
``polaformer_mm.ops`` and ``polaformer_mm.models`` export, and no module importing
another's private (``_``-prefixed) names."""
import ast
import os
import os.path as osp

import pytest

from tests import REPO
from .._fresh_python import fresh_python_json

SCRIPT = r'''
import json
import polaformer_mm
from mmengine.registry import HOOKS, MODELS, RUNNERS
import polaformer_mm.engine as engine
import polaformer_mm.models as models
import polaformer_mm.ops as ops
print('@@api ' + json.dumps(dict(
    top=polaformer_mm.__all__, ops=ops.__all__, models=models.__all__,
    resolved={name: registry.get(name) is getattr(module, name) for registry, module, name in [
        (RUNNERS, engine, 'PolaRunner'), (HOOKS, engine, 'ResumableStateHook'),
        (HOOKS, engine, 'PolaCheckpointHook'), (MODELS, polaformer_mm, 'PolaPVT'),
        (MODELS, polaformer_mm, 'PolaSwin'), (MODELS, polaformer_mm, 'PolaLinearAttention')]},
    missing=[f'{m.__name__}.{n}' for m in (polaformer_mm, ops, models)
             for n in m.__all__ if not hasattr(m, n)])))
'''


@pytest.mark.slow
def test_import_exports_the_backbones_and_registers_the_runner():
    """``import polaformer_mm`` alone (what ``custom_imports`` does) registers the runner
    and its hooks by name, while the top level exports only the models and the version."""
    api = fresh_python_json(SCRIPT, '@@api')
    assert all(api['resolved'].values()), api['resolved']
    assert not api['missing'], api['missing']
    assert sorted(api['top']) == ['PolaLinearAttention', 'PolaPVT', 'PolaSwin', '__version__']
    assert sorted(api['ops']) == sorted([
        'pola_linear_attention', 'set_default_backend', 'BACKENDS', 'ALPHA_MAX',
        'pola_attention_weights', 'attention_entropy', 'pola_exponent', 'depthwise_conv2d',
        'mlp_gelu'
    ])
    assert sorted(api['models']) == sorted([
        'PolaLinearAttention', 'PolaPVT', 'PolaPVTv2', 'PolaSwin', 'PolaViT', 'WarmStartReport',
        'convert_official_checkpoint', 'convert_official_state_dict', 'warm_start'
    ])


def _python_files():
    for top in ('polaformer_mm', 'tools', 'tests'):
        for root, dirs, files in os.walk(osp.join(REPO, top)):
            dirs[:] = [d for d in dirs if not d.startswith('.') and d != '__pycache__']
            for name in files:
                if name.endswith('.py'):
                    yield osp.join(root, name)


def _own(node: ast.ImportFrom, path: str) -> bool:
    """Whether an import is of the repository's own code: relative, of the package or
    the tests, or of a tool next to the importing one (tools import siblings by name)."""
    if node.level:
        return True
    top = (node.module or '').split('.')[0]
    return top in ('polaformer_mm', 'tests') or osp.exists(osp.join(osp.dirname(path), top + '.py'))


def _is_module(node: ast.ImportFrom, path: str, name: str) -> bool:
    """Whether ``from <node.module> import <name>`` imports a module of the repository
    (a package-internal module, named with a leading underscore, which is fine)."""
    if node.level:
        base = osp.dirname(path)
        for _ in range(node.level - 1):
            base = osp.dirname(base)
    else:
        base = REPO
    parts = (node.module or '').split('.') if node.module else []
    target = osp.join(base, *parts, name)
    return osp.exists(target + '.py') or osp.isdir(target)


def test_no_private_name_is_imported_across_modules():
    """Names that a module shares with others are public (no leading underscore); a
    ``_``-prefixed module may hold them (package-internal), its names may not be."""
    found = []
    for path in _python_files():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _own(node, path):
                found += [
                    f'{osp.relpath(path, REPO)}:{node.lineno}: {alias.name}' for alias in node.names
                    if alias.name.startswith('_') and not alias.name.startswith('__')
                    and not _is_module(node, path, alias.name)
                ]
    assert not found, found
