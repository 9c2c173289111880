"""ONNX export of Pola-Swin with balanced linear windows: one graph (opset 11, dynamic
sizes) computes the window sides from the map's, runs each windowed attention in a Scan
over its windows (the sides entering as state variables, the values the exporter shares
between blocks computed again in each) and agrees with PyTorch within 1e-4 at the export
size and two others."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from polaformer_mm.deployment import ExportableModel, check_onnx, compare_onnxruntime, export_onnx
from polaformer_mm.deployment.window_scan import scan_windows
from polaformer_mm.models import PolaSwin
from .._onnx import randomised
from .test_onnx_export import EXPORT_HW, OTHER_HW


def _balanced():
    return PolaSwin(
        arch=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4]),
        attn_types='LLSS',
        window_size=3,
        pretrain_img_size=64,
        linear_window_size=8,
        linear_window_layout='balanced',
        drop_path_rate=0.)


@pytest.mark.slow
def test_balanced_windows_export_agrees_at_three_sizes(tmp_path):
    model = ExportableModel(randomised(_balanced), 'backbone')
    path = str(tmp_path / 'balanced.onnx')
    export_onnx(model, path, EXPORT_HW, dynamic=True, opset=11)
    ops = check_onnx(path)
    assert {'Log', 'Exp'} <= set(ops)
    scans = [n.name for n in onnx.load(path).graph.node if n.op_type == 'Scan']
    assert [s for s in scans
            if s.startswith('/window_scan')] == [f'/window_scan{i}/Scan' for i in range(4)]
    # 72x88: the first stage's 18x22 map in 3x3 windows of 6x8 (the official layout: 8x8,
    # padded to 24x24); 40x130 and 97x61: other sides, other shifts
    rows = compare_onnxruntime(model, path, [EXPORT_HW] + OTHER_HW)
    assert len(rows) == 12
    for row in rows:
        assert row.max_rel < 1e-4, row


def _shared_graph():
    """Two modules 'a.attn' and 'b.attn' over a batch x (B, 3); 'a.attn' computes a
    value from a scalar s that 'b.attn' reads too (as the exporter shares it)."""
    nodes = [
        helper.make_node('Mul', ['s', 'two'], ['/a/attn/Mul_output_0'], name='/a/attn/Mul'),
        helper.make_node(
            'Add', ['x', '/a/attn/Mul_output_0'], ['/a/attn/Add_output_0'], name='/a/attn/Add'),
        helper.make_node('Relu', ['/a/attn/Add_output_0'], ['r'], name='/Relu'),
        helper.make_node(
            'Sub', ['r', '/a/attn/Mul_output_0'], ['/b/attn/Sub_output_0'], name='/b/attn/Sub'),
        helper.make_node('Neg', ['/b/attn/Sub_output_0'], ['y'], name='/Neg'),
    ]
    graph = helper.make_graph(nodes, 'g', [
        helper.make_tensor_value_info('x', TensorProto.FLOAT, ['B', 3]),
        helper.make_tensor_value_info('s', TensorProto.FLOAT, [])
    ], [helper.make_tensor_value_info('y', TensorProto.FLOAT, ['B', 3])],
                              [numpy_helper.from_array(np.array(2.0, np.float32), 'two')])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid('', 13)], ir_version=8)


def test_shared_values_are_copied_and_scalars_are_scan_states():
    model = _shared_graph()
    feed = {
        'x': np.random.RandomState(0).randn(5, 3).astype(np.float32),
        's': np.array(0.7, np.float32)
    }

    def run(m):
        session = ort.InferenceSession(m.SerializeToString(), providers=['CPUExecutionProvider'])
        return session.run(None, feed)[0]

    want = run(model)
    assert scan_windows(model, ['a.attn', 'b.attn']) == 2
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ['Scan', 'Relu', 'Scan', 'Neg']
    for scan in (model.graph.node[0], model.graph.node[2]):
        assert list(scan.input)[0] == 's'  # the scalar: a state variable, not scanned
    np.testing.assert_array_equal(run(model), want)
