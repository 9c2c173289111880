"""polaformer_mm.deployment.window_scan: the attention within windows of an exported graph
runs in a Scan over the windows with the values of the graph as traced (hand-built graphs
at opsets 11 and 13, and a Pola-Swin backbone at sizes other than the export size);
modules whose nodes do not qualify are left alone; the scopes come from the blocks."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from polaformer_mm.deployment import ExportableModel, check_onnx, export_onnx
from polaformer_mm.deployment.window_scan import scan_windows, window_attention_scopes
from polaformer_mm.utils.capture import exportable
from polaformer_mm.utils.compat import TORCHSCRIPT_ONNX_EXPORT
from polaformer_mm.utils.graph_forms import graph_forms
from .._onnx import randomised
from .test_onnx_export import BACKBONES


def _graph(opset, outputs_read_outside=1):
    """x (B, 3, 4) and a mask (B, 3) -> '/m/attn/' nodes -> a Relu outside."""
    nodes = [
        helper.make_node('Cast', ['mask'], ['/m/attn/Cast_output_0'], name='/m/attn/Cast', to=1),
        helper.make_node('Mul', ['x', 'two'], ['/m/attn/Mul_output_0'], name='/m/attn/Mul'),
        helper.make_node(
            'ReduceMax', ['/m/attn/Mul_output_0'], ['/m/attn/Max_output_0'],
            name='/m/attn/ReduceMax',
            axes=[2],
            keepdims=0),
        helper.make_node(
            'Add', ['/m/attn/Max_output_0', '/m/attn/Cast_output_0'], ['/m/attn/Add_output_0'],
            name='/m/attn/Add'),
        helper.make_node('Relu', ['/m/attn/Add_output_0'], ['y'], name='/Relu'),
    ]
    outputs = [helper.make_tensor_value_info('y', TensorProto.FLOAT, ['B', 3])]
    if outputs_read_outside == 2:
        nodes.append(helper.make_node('Neg', ['/m/attn/Mul_output_0'], ['z'], name='/Neg'))
        outputs.append(helper.make_tensor_value_info('z', TensorProto.FLOAT, ['B', 3, 4]))
    graph = helper.make_graph(nodes, 'g', [
        helper.make_tensor_value_info('x', TensorProto.FLOAT, ['B', 3, 4]),
        helper.make_tensor_value_info('mask', TensorProto.BOOL, ['B', 3])
    ], outputs, [numpy_helper.from_array(np.array(2.0, np.float32), 'two')])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid('', opset)], ir_version=8)


def _run(model, feed):
    session = ort.InferenceSession(model.SerializeToString(), providers=['CPUExecutionProvider'])
    return session.run(None, feed)


@pytest.mark.parametrize('opset', [11, 13])
def test_module_nodes_run_in_a_scan_with_the_same_values(opset):
    model = _graph(opset)
    feed = {
        'x': np.random.RandomState(0).randn(5, 3, 4).astype(np.float32),
        'mask': np.random.RandomState(1).rand(5, 3) > 0.5
    }
    want = _run(model, feed)
    assert scan_windows(model, ['m.attn']) == 1
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node] == ['Scan', 'Relu']
    body = model.graph.node[0].attribute[0].g
    assert [n.op_type for n in body.node
            ] == ['Unsqueeze', 'Unsqueeze', 'Cast', 'Mul', 'ReduceMax', 'Add', 'Squeeze']
    for got, ref in zip(_run(model, feed), want):
        np.testing.assert_array_equal(got, ref)
    feed = {k: v[:1] for k, v in feed.items()}  # one window
    np.testing.assert_array_equal(_run(model, feed)[0], _run(_graph(opset), feed)[0])


def test_modules_that_do_not_qualify_are_left_alone():
    model = _graph(13, outputs_read_outside=2)  # two values read outside the module
    before = [n.op_type for n in model.graph.node]
    assert scan_windows(model, ['m.attn']) == 0
    assert [n.op_type for n in model.graph.node] == before
    assert scan_windows(_graph(13), ['m.other']) == 0  # no such scope
    assert scan_windows(_graph(13), []) == 0


def test_scopes_are_the_windowed_pola_blocks():
    windows = ExportableModel(BACKBONES['swin-windows'](), 'backbone')
    assert window_attention_scopes(windows) == [
        f'model.stages.{s}.blocks.{b}.attn' for s in (0, 1) for b in (0, 1)
    ]
    assert window_attention_scopes(BACKBONES['swin-global']()) == []
    assert window_attention_scopes(BACKBONES['pvt']()) == []


@pytest.mark.slow
def test_backbone_export_scans_its_windows_with_the_values_as_traced(tmp_path):
    model = ExportableModel(randomised(BACKBONES['swin-windows']), 'backbone')
    path = str(tmp_path / 'swin.onnx')
    export_onnx(model, path, (72, 88), block_mlps=False)
    scans = [n.name for n in onnx.load(path).graph.node if n.op_type == 'Scan']
    assert scans == [f'/window_scan{i}/Scan' for i in range(4)]
    assert {'Log', 'Exp'} <= set(check_onnx(path))  # in the Scan bodies
    # the graph as traced, with and without the rewrite: onnxruntime's values agree
    traced = str(tmp_path / 'traced.onnx')
    images = torch.randn(1, 3, 72, 88)
    with torch.no_grad(), exportable(), graph_forms(model):
        torch.onnx.export(
            model, (images, ),
            traced,
            input_names=['input'],
            dynamic_axes={'input': {
                2: 'h',
                3: 'w'
            }},
            opset_version=11,
            **TORCHSCRIPT_ONNX_EXPORT)
    plain, scanned = onnx.load(traced), onnx.load(traced)
    assert scan_windows(scanned, window_attention_scopes(model)) == 4
    sessions = [
        ort.InferenceSession(m.SerializeToString(), providers=['CPUExecutionProvider'])
        for m in (plain, scanned)
    ]
    for hw in [(72, 88), (40, 130)]:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            eager = model(x)
        want, got = (s.run(None, {'input': x.numpy()}) for s in sessions)
        for a, b, ref in zip(got, want, eager):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
            assert np.abs(a - ref.numpy()).max() < 1e-4 * np.abs(ref.numpy()).max()
