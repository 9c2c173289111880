"""ONNX export of PolaPVTv2 (TorchScript exporter, opset 11, dynamic sizes), as
test_onnx_export.py exports the other backbones: one file runs in onnxruntime at sizes
other than the export size with the stage maps of PyTorch, 'L' stages (with and without
spatial reduction) beside mmdet's softmax 'S' stages."""
import pytest

from polaformer_mm.deployment import ExportableModel, check_onnx, compare_onnxruntime, export_onnx
from polaformer_mm.models import PolaPVTv2
from .._onnx import randomised

EXPORT_HW = (72, 88)
# smaller in one side and larger in the other, odd sides (the overlapping embeddings'
# ceil sizes); every 'S' stage keeps a map of at least its sr_ratio
OTHER_HW = [(40, 130), (97, 61)]


def _pvtv2(attn_types, la_sr_ratios):
    return PolaPVTv2(
        arch=dict(
            embed_dims=[16, 32, 40, 64],
            depths=[1, 1, 1, 1],
            num_heads=[1, 2, 2, 4],
            mlp_ratios=[2, 2, 2, 2],
            sr_ratios=[8, 4, 2, 1]),
        attn_types=attn_types,
        la_sr_ratios=la_sr_ratios,
        pretrain_img_size=64,
        drop_path_rate=0.)


BACKBONES = {
    # Pola stages with spatial reduction 8 and 4, mmdet's softmax stages with 2 and 1
    'LLSS-8421': lambda: _pvtv2('LLSS', '8421'),
    # Pola everywhere, no reduction (the default)
    'LLLL': lambda: _pvtv2('LLLL', '1111'),
}


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_pvtv2_onnx_equals_pytorch_at_other_sizes(name, tmp_path):
    model = ExportableModel(randomised(BACKBONES[name]), 'backbone')
    path = str(tmp_path / f'{name}.onnx')
    names = export_onnx(model, path, EXPORT_HW, dynamic=True, opset=11)
    assert len(names) == 4
    ops = check_onnx(path)
    # the attention's features are in the graph (log |x|, exp), not a constant;
    # the positional encodings are resized in it
    assert {'Log', 'Exp', 'MatMul', 'Resize'} <= set(ops)
    rows = compare_onnxruntime(model, path, [EXPORT_HW] + OTHER_HW)
    assert len(rows) == 12
    for row in rows:
        assert row.max_rel < 1e-4, row
    # the stage maps follow the input size (strides 4, 8, 16, 32, ceil)
    assert [r.out_shape[2:] for r in rows if r.shape == (40, 130)] == [(10, 33), (5, 17), (3, 9),
                                                                       (2, 5)]
