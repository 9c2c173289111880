"""ONNX export (TorchScript exporter, opset 11, dynamic sizes): one file per backbone runs
in onnxruntime at sizes other than the export size with the stage maps of PyTorch; an
export leaves the module caches as eager use needs them; the tensor part of the quickstart
detector exports through tools/deployment/pytorch2onnx.py --tensor-only (no mmdeploy; the
end-to-end export is tested in test_end2end.py)."""
import os.path as osp

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from polaformer_mm.deployment import ExportableModel, check_onnx, compare_onnxruntime, export_onnx
from polaformer_mm.models import PolaPVT, PolaSwin
from polaformer_mm.ops import pola_linear_attention
from polaformer_mm.utils.capture import graph_capture
from polaformer_mm.utils.compat import TORCHSCRIPT_ONNX_EXPORT
from polaformer_mm.utils.graph_forms import graph_forms
from tests import REPO
from .._onnx import randomised
from .._tools import load_tool

EXPORT_HW = (72, 88)
# smaller in one side, larger in the other; at 40x130 the second Swin stage (10x33 ->
# 5x17) is no longer shifted, which the export at 72x88 (9x11 > 8) shifts
OTHER_HW = [(40, 130), (97, 61)]


def _pvt():
    return PolaPVT(
        arch=dict(
            embed_dims=[16, 32, 40, 64],
            depths=[1, 1, 1, 1],
            num_heads=[1, 2, 2, 4],
            mlp_ratios=[2, 2, 2, 2],
            sr_ratios=[8, 4, 2, 1]),
        la_sr_ratios='8421',
        attn_types='LLLS',
        pretrain_img_size=64)


def _swin(linear_window_size):
    return PolaSwin(
        arch=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4]),
        attn_types='LLSS',
        window_size=3,
        pretrain_img_size=64,
        linear_window_size=linear_window_size,
        drop_path_rate=0.)


BACKBONES = {'pvt': _pvt, 'swin-windows': lambda: _swin(8), 'swin-global': lambda: _swin(None)}


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_backbone_onnx_equals_pytorch_at_other_sizes(name, tmp_path):
    model = ExportableModel(randomised(BACKBONES[name]), 'backbone')
    path = str(tmp_path / f'{name}.onnx')
    names = export_onnx(model, path, EXPORT_HW, dynamic=True, opset=11)
    assert len(names) == 4
    ops = check_onnx(path)
    # the attention's features are in the graph (log |x|, exp), not a constant; the
    # MLPs run over blocks of tokens (polaformer_mm.deployment.blocked_mlp)
    assert {'Log', 'Exp', 'MatMul', 'Scan'} <= set(ops)
    # the positional encodings follow the input size (windows: a fixed grid, no resize)
    assert ('Resize' in ops) == (name != 'swin-windows')
    rows = compare_onnxruntime(model, path, [EXPORT_HW] + OTHER_HW)
    assert len(rows) == 12
    for row in rows:
        assert row.max_rel < 1e-4, row
    # the stage maps follow the input size (strides 4, 8, 16, 32, ceil)
    assert [r.out_shape[2:] for r in rows if r.shape == (40, 130)] == [(10, 33), (5, 17), (3, 9),
                                                                       (2, 5)]


@pytest.mark.slow
@pytest.mark.parametrize('name', ['pvt', 'swin-windows'])
def test_export_leaves_caches_for_eager_use(name, tmp_path):
    model = randomised(BACKBONES[name])
    fresh = randomised(BACKBONES[name])
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 80))  # fills the eager caches
        export_onnx(ExportableModel(model, 'backbone'), str(tmp_path / 'm.onnx'), (56, 72))
        for hw in [(56, 72), (64, 80), (48, 104)]:
            x = torch.randn(1, 3, *hw)
            for got, want in zip(model(x), fresh(x)):
                assert type(got) is torch.Tensor
                torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize('d', [1, 5, 8])
def test_op_is_recorded_whole_by_a_trace(d):
    """A trace of the op records a graph that gives the eager op's results at another
    token count (the op's autograd Function would be traced as constants)."""
    torch.manual_seed(0)
    h = 2
    power, scale = torch.randn(1, h, 1, d), torch.rand(1, h, 1, d) + 0.5

    def attend(q, k, v):
        assert graph_capture() == torch.jit.is_tracing()
        return pola_linear_attention(q, k, v, power, 4.0, 1e-6, scale=scale)

    def inputs(n):
        return [torch.randn(2, h, n, d) * 3 for _ in range(3)]

    traced = torch.jit.trace(attend, tuple(inputs(20)))
    assert not graph_capture()
    for n in (20, 37):
        args = inputs(n)
        torch.testing.assert_close(traced(*args), attend(*args), rtol=1e-5, atol=1e-6)


def _cpu_half_convolution():
    try:
        torch.nn.functional.conv2d(torch.ones(1, 1, 3, 3).half(), torch.ones(1, 1, 1, 1).half())
    except RuntimeError as err:  # torch < 2.2 has no float16 convolution on the CPU
        return str(err)
    return None


@pytest.mark.slow
@pytest.mark.skipif(
    _cpu_half_convolution() is not None,
    reason=f'tracing a float16 model on the CPU needs float16 convolutions there '
    f'({_cpu_half_convolution()})')
def test_fp16_graph_is_finite(tmp_path):
    """A half-precision export runs the attention's features in float32 (the op
    computes them so, and the graph keeps the casts) and gives finite float16 maps in
    onnxruntime."""
    model = ExportableModel(randomised(BACKBONES['pvt']), 'backbone').half()
    path = str(tmp_path / 'fp16.onnx')
    images = torch.randn(1, 3, *EXPORT_HW).half()
    with torch.no_grad(), graph_forms(model):
        torch.onnx.export(
            model, (images, ),
            path,
            input_names=['input'],
            dynamic_axes={'input': {
                2: 'height',
                3: 'width'
            }},
            opset_version=11,
            **TORCHSCRIPT_ONNX_EXPORT)
    # the precision the graph keeps: the polarity features (log |x|, their row maxima,
    # exp) in float32, LayerNorm's decomposition (its Pow) not in float16
    graph = onnx.shape_inference.infer_shapes(onnx.load(path)).graph
    dtypes = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input]}
    dtypes.update({t.name: t.data_type for t in graph.initializer})
    kept = {}
    for node in graph.node:
        if node.op_type in ('Log', 'Exp', 'ReduceMax', 'Pow'):
            kept.setdefault(node.op_type, set()).add(dtypes.get(node.input[0]))
    assert kept['Log'] == kept['Exp'] == kept['ReduceMax'] == {onnx.TensorProto.FLOAT}, kept
    assert onnx.TensorProto.FLOAT16 not in kept['Pow'], kept
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    for hw in [EXPORT_HW, OTHER_HW[0]]:
        x = (torch.randn(1, 3, *hw) * 3).half().numpy()
        outs = session.run(None, {'input': x})
        assert all(o.dtype == np.float16 and np.isfinite(o).all() for o in outs)


def _tool():
    return load_tool('deployment/pytorch2onnx.py')


@pytest.mark.slow
def test_detector_tensor_part_exports_with_the_tool(tmp_path, capsys):
    out = str(tmp_path / 'mask-rcnn.onnx')
    result = _tool().main([
        osp.join(REPO, 'configs', 'quickstart',
                 'mask-rcnn_pola-pvt-nano_fpn_synthetic.py'), '--shape', '64', '64', '--dynamic',
        '--tensor-only', '--out', out, '--check-shapes', '48', '80'
    ])
    assert result['ok'] and osp.isfile(out)
    # RPN objectness and box deltas of the 5 FPN levels, at both sizes
    assert len(result['rows']) == 20
    assert {r.shape for r in result['rows']} == {(64, 64), (48, 80)}
    printed = capsys.readouterr().out
    assert 'onnx.checker: ok' in printed and 'backbone, neck and RPN head' in printed


def test_tool_refuses_check_shapes_of_a_static_graph(capsys):
    with pytest.raises(SystemExit):
        _tool().parse_args(['cfg.py', '--shape', '64', '64', '--check-shapes', '48', '80'])
    assert '--check-shapes needs --dynamic' in capsys.readouterr().err
