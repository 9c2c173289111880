"""What every export does to the written file (polaformer_mm.deployment.graph_passes): the
empty trailing inputs the exporter writes are dropped with the same values, so that
onnxruntime folds the constant padding of a patchifying convolution into the convolution
(polaformer_mm.models.utils.pad_for_patches), and the padded convolution gives the
eager result at sizes that are and are not multiples of the patch."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn

from polaformer_mm.deployment import drop_omitted_inputs, finish_graph_file
from polaformer_mm.models.utils import PatchEmbed
from polaformer_mm.utils.capture import exportable
from polaformer_mm.utils.compat import TORCHSCRIPT_ONNX_EXPORT

PATCH = 4


def _export(path):
    torch.manual_seed(0)
    model = PatchEmbed(3, 8, PATCH).eval()

    class Tokens(nn.Module):

        def __init__(self):
            super().__init__()
            self.embed = model

        def forward(self, x):
            return self.embed(x)[0]

    with exportable(), torch.no_grad():
        torch.onnx.export(
            Tokens().eval(), (torch.randn(1, 3, 30, 41), ),
            path,
            input_names=['x'],
            output_names=['tokens'],
            dynamic_axes={
                'x': {
                    2: 'H',
                    3: 'W'
                },
                'tokens': {
                    1: 'N'
                }
            },
            opset_version=11,
            **TORCHSCRIPT_ONNX_EXPORT)
    return model


def _optimized_ops(path, tmp_path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / 'optimized.onnx')
    ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])
    return [node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node]


def test_padding_folds_into_the_patch_convolution(tmp_path):
    path = str(tmp_path / 'embed.onnx')
    model = _export(path)
    pads = [n for n in onnx.load(path).graph.node if n.op_type == 'Pad']
    assert len(pads) == 1
    trailing = sum(1 for n in onnx.load(path).graph.node if n.input and not n.input[-1])

    assert finish_graph_file(
        path, block_mlps=False) == {
            'omitted_inputs': trailing,
            'blocked_mlps': 0,
            'scanned_windows': 0
        }
    assert finish_graph_file(path, block_mlps=False)['omitted_inputs'] == 0  # nothing left
    assert all(n.input[-1] for n in onnx.load(path).graph.node if n.input)
    assert 'Pad' not in _optimized_ops(path, tmp_path)

    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    for H, W in ((32, 44), (30, 41), (5, 9), (4, 4)):  # multiples of the patch and not
        x = torch.randn(1, 3, H, W)
        with torch.no_grad():
            expected, hw_shape = model(x)
        assert hw_shape == (-(-H // PATCH), -(-W // PATCH))
        got = session.run(None, {'x': x.numpy()})[0]
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_drop_omitted_inputs_keeps_inner_empty_inputs():
    node = onnx.helper.make_node('Clip', ['x', '', 'max', '', ''], ['y'])
    graph = onnx.helper.make_graph([node], 'g', [], [])
    model = onnx.helper.make_model(graph)
    assert drop_omitted_inputs(model) == 1
    assert list(model.graph.node[0].input) == ['x', '', 'max']
    assert drop_omitted_inputs(model) == 0


@pytest.mark.parametrize('patch', [1, 2, 7])
def test_captured_patch_padding_gives_the_eager_grid(patch):
    from polaformer_mm.models.utils import pad_for_patches, pad_to_multiple
    conv = nn.Conv2d(2, 3, patch, patch)
    for H, W in ((patch * 3, patch * 2 + 1), (1, 1), (patch + 1, 5 * patch - 1)):
        x = torch.randn(1, 2, H, W)
        with torch.no_grad():
            eager = conv(pad_to_multiple(x, patch))
            with exportable():
                captured = conv(pad_for_patches(x, patch))
        torch.testing.assert_close(captured, eager)
