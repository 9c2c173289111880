"""One forward per model: no module under ``polaformer_mm/models/backbones/`` and not
``polaformer_mm/models/attention.py`` asks whether it is being captured or exported
(``onnx_export()`` / ``graph_capture()`` of :mod:`polaformer_mm.utils.capture`): the forms
an exported graph records are declared with
:func:`polaformer_mm.utils.graph_forms.register_graph_form` and chosen by the exporter.
A static check of the sources: a call of either name, an import of it (``from ...
import``, also under another name) or an attribute of that name anywhere in the file."""
import ast
import glob
import os.path as osp

from tests import REPO

#: The names the models may not use: the project's switch and the detectors under it.
SWITCHES = ('onnx_export', 'graph_capture', 'is_tracing', 'is_scripting', 'is_in_onnx_export',
            'is_compiling', 'is_exporting')


def _model_sources():
    """The files checked, relative to the repository."""
    files = sorted(
        glob.glob(
            osp.join(REPO, 'polaformer_mm', 'models', 'backbones', '**', '*.py'), recursive=True))
    files.append(osp.join(REPO, 'polaformer_mm', 'models', 'attention.py'))
    return [osp.relpath(f, REPO) for f in files]


def switch_uses(source: str, filename: str = '<source>'):
    """``(line, what)`` for every use of a name of :data:`SWITCHES` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.ImportFrom):
            found += [(node.lineno, f'imports {a.name}') for a in node.names if a.name in SWITCHES]
        elif isinstance(node, ast.Name) and node.id in SWITCHES:
            found.append((node.lineno, f'uses {node.id}'))
        elif isinstance(node, ast.Attribute) and node.attr in SWITCHES:
            found.append((node.lineno, f'uses .{node.attr}'))
        elif _is_tensor_test(node):  # sizes that are tensors only in a trace
            found.append((node.lineno, 'asks isinstance(..., Tensor)'))
    return sorted(set(found))


def _is_tensor_test(node) -> bool:
    """``isinstance(x, Tensor)`` / ``isinstance(x, torch.Tensor)`` (also in a tuple)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == 'isinstance' and len(node.args) == 2):
        return False
    kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
    return any((isinstance(k, ast.Name) and k.id == 'Tensor') or (
        isinstance(k, ast.Attribute) and k.attr == 'Tensor') for k in kinds)


def test_the_check_finds_each_kind_of_use():
    source = '\n'.join([
        'from ..utils.capture import onnx_export',
        'from ...utils.capture import graph_capture as captured',
        'from ..utils import capture',
        'def forward(x):',
        '    if capture.graph_capture():',
        '        return x',
        '    return onnx_export()',
    ])
    assert switch_uses(source) == [(1, 'imports onnx_export'), (2, 'imports graph_capture'),
                                   (5, 'uses .graph_capture'), (7, 'uses onnx_export')]
    assert switch_uses('from ..utils.graph_forms import register_graph_form\n') == []
    assert switch_uses('if torch.jit.is_tracing() or isinstance(pad, (int, Tensor)):\n'
                       '    pass\n') == [(1, 'asks isinstance(..., Tensor)'),
                                         (1, 'uses .is_tracing')]


def test_models_do_not_branch_on_capture_or_export():
    files = _model_sources()
    assert 'polaformer_mm/models/backbones/pola_swin.py' in files
    offenders = {}
    for rel in files:
        with open(osp.join(REPO, rel)) as f:
            uses = switch_uses(f.read(), rel)
        if uses:
            offenders[rel] = uses
    assert not offenders, (
        'models branch on the capture switch; declare the export form with '
        f'polaformer_mm.utils.graph_forms.register_graph_form instead: {offenders}')
