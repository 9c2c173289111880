"""The ONNX rewrite that runs transformer MLPs over blocks of tokens
(polaformer_mm.deployment.blocked_mlp): which chains it takes, and that the rewritten graph
gives the values of the graph as exported at token counts below, at and between whole
blocks, at opsets 11 and 17, for both forms of a token-wise layer (``Gemm`` on rows,
``MatMul`` + ``Add`` on (B, N, C)) and with biases the exporter writes as ``Identity`` nodes."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn

from polaformer_mm.deployment import block_mlps, block_mlps_file, check_onnx
from polaformer_mm.utils.compat import TORCHSCRIPT_ONNX_EXPORT

C, HIDDEN = 6, 20


class _Mlps(nn.Module):
    """Four MLPs in a row on (B, N, C): two GELU MLPs the rewrite takes (the token-wise
    layers on rows, then on the 3-d tensor), one with ReLU and one whose hidden
    activation is also an output, which it leaves alone."""

    def __init__(self):
        super().__init__()
        self.rows = nn.Sequential(nn.Linear(C, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, C))
        self.tokens = nn.Sequential(nn.Linear(C, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, C))
        self.relu = nn.Sequential(nn.Linear(C, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, C))
        self.fc1, self.fc2 = nn.Linear(C, HIDDEN), nn.Linear(HIDDEN, C)

    def forward(self, x):
        B, N, _ = x.shape
        x = x + self.rows(x.reshape(B * N, C)).reshape(B, N, C)
        x = x + self.tokens(x)
        x = x + self.relu(x)
        hidden = torch.nn.functional.gelu(self.fc1(x))
        return x + self.fc2(hidden), hidden


def _export(path, opset, equal_biases=False):
    torch.manual_seed(0)
    model = _Mlps().eval()
    if equal_biases:  # as untrained layers have them: the exporter writes the later ones
        # as an Identity of the first
        with torch.no_grad():
            for mlp in (model.rows, model.tokens):
                mlp[0].bias.zero_()
                mlp[2].bias.zero_()
    x = torch.randn(2, 9, C)
    torch.onnx.export(
        model, (x, ),
        path,
        input_names=['x'],
        output_names=['y', 'hidden'],
        dynamic_axes={
            'x': {
                0: 'B',
                1: 'N'
            },
            'y': {
                0: 'B',
                1: 'N'
            },
            'hidden': {
                0: 'B',
                1: 'N'
            }
        },
        opset_version=opset,
        **TORCHSCRIPT_ONNX_EXPORT)
    return model


def _run(path, x):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])
    return session.run(None, {'x': x.numpy()})


@pytest.mark.parametrize('opset,equal_biases', [(11, False), (17, False), (11, True)])
def test_rewritten_graph_gives_the_exported_values(opset, equal_biases, tmp_path):
    plain, blocked = str(tmp_path / 'plain.onnx'), str(tmp_path / 'blocked.onnx')
    model = _export(plain, opset, equal_biases)
    graph = onnx.load(plain)
    # blocks of 7 rows (7 * HIDDEN hidden values): several blocks and padded ones
    assert block_mlps(graph, block_elements=7 * HIDDEN) == 2
    onnx.save(graph, blocked)
    ops = check_onnx(blocked)  # the full checker, with shape inference
    assert 'Scan' in ops and 'Relu' in ops
    scans = [n for n in graph.graph.node if n.op_type == 'Scan']
    assert len(scans) == 2
    # each body holds one MLP: two token-wise layers and the GELU
    for scan in scans:
        body = scan.attribute[0].g
        kinds = [n.op_type for n in body.node]
        assert kinds.count('Erf') == 1 and (kinds.count('Gemm') == 2 or kinds.count('MatMul') == 2)
    # the rows of B x N: fewer than a block, one block, whole blocks, between them
    for B, N in [(1, 1), (1, 7), (2, 7), (1, 23), (3, 50)]:
        x = torch.randn(B, N, C)
        want = _run(plain, x)
        got = _run(blocked, x)
        with torch.no_grad():
            ref = model(x)
        for w, g, r in zip(want, got, ref):
            assert g.shape == w.shape == tuple(r.shape)
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(g, r.numpy(), rtol=1e-5, atol=1e-5)


def test_file_form_and_graphs_without_mlps(tmp_path):
    path = str(tmp_path / 'm.onnx')
    _export(path, 11)
    assert block_mlps_file(path) == 2
    assert block_mlps_file(path) == 0  # nothing left to rewrite: the file stays
    assert 'Scan' in check_onnx(path)
    # opsets before 11 lack the Pad and Slice inputs the rewrite uses: left alone
    graph = onnx.load(path)
    graph.opset_import[0].version = 10
    assert block_mlps(graph) == 0


@pytest.mark.parametrize('bias_kind,expected', [('channels', 1), ('rows', 0)])
def test_a_bias_per_row_is_left_alone(bias_kind, expected):
    """A ``Gemm`` whose bias is not one value per output channel (here a graph input of
    one value per row) does not split into blocks of rows."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    inputs = [helper.make_tensor_value_info('x', TensorProto.FLOAT, ['N', C])]
    inits = [init('w1', HIDDEN, C), init('w2', C, HIDDEN), init('b2', C)]
    inits += [
        numpy_helper.from_array(np.array(v, np.float32), n)
        for n, v in (('sqrt2', 2**0.5), ('one', 1.0), ('half', 0.5))
    ]
    if bias_kind == 'channels':
        inits.append(init('b1', HIDDEN))
    else:
        inputs.append(helper.make_tensor_value_info('b1', TensorProto.FLOAT, ['N', HIDDEN]))
    nodes = [
        helper.make_node('Gemm', ['x', 'w1', 'b1'], ['h'], transB=1),
        helper.make_node('Div', ['h', 'sqrt2'], ['d']),
        helper.make_node('Erf', ['d'], ['e']),
        helper.make_node('Add', ['e', 'one'], ['e1']),
        helper.make_node('Mul', ['h', 'e1'], ['g0']),
        helper.make_node('Mul', ['g0', 'half'], ['g']),
        helper.make_node('Gemm', ['g', 'w2', 'b2'], ['y'], transB=1),
    ]
    graph = helper.make_graph(nodes, 'mlp', inputs,
                              [helper.make_tensor_value_info('y', TensorProto.FLOAT, ['N', C])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 11)])
    assert block_mlps(model) == expected
