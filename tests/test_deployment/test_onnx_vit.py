"""PolaViT in a graph: the ONNX export (TorchScript exporter, opset 11, dynamic sizes)
runs in onnxruntime at sizes other than the export size with PyTorch's outputs, and the
FLOP count of polaformer_mm.analysis.flops counts the attention of 'L' and 'S' blocks."""
import pytest
import torch
from mmengine.config import Config

from polaformer_mm.analysis.flops import measure, register_extra_flop_ops
from polaformer_mm.deployment import ExportableModel, check_onnx, compare_onnxruntime, export_onnx
from polaformer_mm.models import PolaViT
from .._onnx import randomised

EXPORT_HW = (72, 88)
# smaller in one side, larger in the other, neither a multiple of the patch
OTHER_HW = [(40, 130), (97, 61)]
ARCH = dict(embed_dims=32, num_layers=3, num_heads=2, feedforward_channels=64)


def _small_vit(**kwargs):
    """A small PolaViT (three blocks of 32 channels, all three returned)."""
    return PolaViT(arch=ARCH, pretrain_img_size=64, out_indices=(0, 1, 2), **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize('attn_types,output_cls_token', [('L', False), ('LSL', True)])
def test_backbone_onnx_equals_pytorch_at_other_sizes(attn_types, output_cls_token, tmp_path):
    model = ExportableModel(
        randomised(lambda: _small_vit(attn_types=attn_types, output_cls_token=output_cls_token)),
        'backbone')
    path = str(tmp_path / 'vit.onnx')
    names = export_onnx(model, path, EXPORT_HW, dynamic=True, opset=11)
    per_index = 2 if output_cls_token else 1
    assert len(names) == 3 * per_index
    ops = set(check_onnx(path))
    # the attention's features are in the graph (log |x|, exp), the position
    # embedding and P resized by the graph, the class query's softmax
    assert {'Log', 'Exp', 'MatMul', 'Resize', 'Softmax', 'Pad'} <= ops
    rows = compare_onnxruntime(model, path, [EXPORT_HW] + OTHER_HW)
    assert len(rows) == 3 * 3 * per_index
    for row in rows:
        assert row.max_rel < 1e-4, row
    # the maps follow the input size (stride 16, ceil)
    maps = [r.out_shape[2:] for r in rows if len(r.out_shape) == 4]
    assert maps == [(5, 6)] * 3 + [(3, 9)] * 3 + [(7, 4)] * 3


# inputs of one patch or less (a 1x1 patch grid: the position embedding and every P resized
# from 14x14 to 1x1 by the graph, the input padded to the patch), a 1x2 grid, and larger ones
SMALL_HW = [(16, 16), (8, 8), (1, 1), (17, 5), (32, 32), (224, 224)]


@pytest.mark.slow
@pytest.mark.parametrize('weights', ['random', 'deit-init'])
def test_dynamic_export_agrees_at_one_patch_and_less(weights, tmp_path):
    """A dynamic export at 72x88 of a PolaViT whose position tables lie on the 14x14 grid
    of pretrain_img_size=224 agrees with PyTorch within 1e-4 of each output's peak at
    inputs of 16 px or less (where the graph resizes the tables to a 1x1 grid) and at larger
    ones; with weights of DeiT's initialisation (outputs of order 1, P random as after
    training) also within 1e-4 absolute. Random weights of std 0.3 give outputs of order
    100, whose float32 rounding alone is of order 1e-3 absolute."""
    if weights == 'random':
        backbone = randomised(lambda: PolaViT(arch=ARCH, out_indices=(0, 1, 2), attn_types='LSL'))
    else:
        torch.manual_seed(0)
        backbone = PolaViT(arch=ARCH, out_indices=(0, 1, 2), attn_types='LSL')
        backbone.init_weights()
        with torch.no_grad():
            for block in (backbone.layers[0], backbone.layers[2]):
                block.attn.positional_encoding.normal_(0, 0.02)
        backbone.eval()
    assert backbone.patch_resolution == (14, 14)
    model = ExportableModel(backbone, 'backbone')
    path = str(tmp_path / 'vit.onnx')
    export_onnx(model, path, EXPORT_HW, dynamic=True, opset=11)
    rows = compare_onnxruntime(model, path, SMALL_HW)
    assert len(rows) == 3 * len(SMALL_HW)
    for row in rows:
        assert row.max_rel < 1e-4, row
        if weights == 'deit-init':
            assert row.max_abs < 1e-4, row
    assert [r.out_shape[2:] for r in rows[::3]] == [(1, 1), (1, 1), (1, 1), (2, 1), (2, 2),
                                                    (14, 14)]


@pytest.fixture
def flop_table():
    """polaformer_mm.analysis.flops adds counters to mmengine's default FLOP table;
    restore it."""
    from mmengine.analysis import complexity_analysis
    table = complexity_analysis._DEFAULT_SUPPORTED_FLOP_OPS
    saved = dict(table)
    yield
    table.clear()
    table.update(saved)


@pytest.mark.parametrize('attn_types', ['L', 'LSL', 'S'])
def test_flops_count_the_attention(attn_types, flop_table):
    """get_flops.py's measurement (polaformer_mm.analysis.flops.measure) counts every
    non-elementwise operator of PolaViT, the attention products included: beyond what
    mmengine counts with the products (matmul, SDPA) left out, the Pola op's two
    products and the class query's softmax in every 'L' block, the softmax of every
    'S' block."""
    register_extra_flop_ops()
    backbone = dict(type='PolaViT', arch=ARCH, pretrain_img_size=64, attn_types=attn_types)
    cfg = Config(dict(default_scope='mmseg', model=dict(backbone=backbone)))
    row = measure(cfg, (64, 96), whole=False)
    assert row['uncounted'] == []
    model = PolaViT(arch=ARCH, pretrain_img_size=64, attn_types=attn_types).eval()
    assert row['params'] == sum(p.numel() for p in model.parameters())
    from mmengine.analysis import FlopAnalyzer
    analyzer = FlopAnalyzer(model, (torch.randn(1, 3, 64, 96), ))
    analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    attention = ('aten::matmul', 'aten::scaled_dot_product_attention')
    analyzer.set_op_handle(**{op: (lambda inputs, outputs: 0) for op in attention})
    # a 4 x 6 patch grid and the class token; two heads of 16 channels
    N, n, d, h, C = 4 * 6, 4 * 6 + 1, 16, 2, 32
    # the key summaries K^T v and the key means, queries times them
    pola = h * (2 * d * n * (d + 1) + N * 2 * d * (d + 2))
    cls_softmax = h * (1 * n * 2 * d)  # q k^T and the weighted sum of one query
    softmax = h * (n * n * 2 * d)
    # a bicubic resize of the 4 x 4 grid to 4 x 6 (the position embedding; the P of
    # every 'L' block) as two products with interpolation matrices, as mmengine counts
    # a matmul: columns (6, 4) times (4, C), then rows (4, 4) times (4, 6 * C)
    resize = 6 * 4 * C + 4 * 4 * 6 * C
    kinds = model.attn_types  # one letter per block
    expected = (
        kinds.count('L') * (pola + cls_softmax + resize) + kinds.count('S') * softmax + resize)
    assert row['flops'] - analyzer.total() == expected


def test_build_model_reads_no_pretrained_file():
    """Without a checkpoint, build_model gives the model's initialisation and reads no
    pretrained file the config names: mmseg's DeiT baseline names one by ``model.pretrained``
    (which mmseg turns into the backbone's init_cfg), a file that is not here."""
    import os.path as osp

    from polaformer_mm.deployment import build_model
    from polaformer_mm.engine.entry import load_config
    from .. import REPO
    cfg = load_config(
        osp.join(REPO, 'configs', 'pola_vit', 'upernet_deit-s16_8xb2-160k_ade20k-512x512.py'))
    assert cfg.model.pretrained and not osp.exists(osp.join(REPO, cfg.model.pretrained))
    model = build_model(cfg)
    assert not model.training
    assert type(model.backbone).__name__ == 'VisionTransformer'
    # the caller's config is left as it was
    assert cfg.model.pretrained and 'init_cfg' not in cfg.model.backbone


# one side or both of a single patch after padding (the graph pads by patch - 1, the eager
# model to the next multiple: the same convolution windows), beside sizes of more patches
ONE_PATCH_HW = [(8, 8), (1, 1), (16, 16), (16, 3), (8, 40), (40, 8), (1, 33), (17, 16)]


@pytest.mark.slow
def test_export_of_the_upernet_backbone_settings_agrees_at_one_patch(tmp_path):
    """The UperNet Pola-DeiT configs' backbone settings (stochastic depth 0.1, no final
    norm, bicubic position embedding, tables on the 14x14 grid of 224), small, wrapped in an
    ExportableModel left in training mode (as nn.Module builds it) and exported with dynamic
    sizes: the backbone keeps its eval mode (torch's export gave the wrapper's training flag
    back to every submodule, so stochastic depth was then on in PyTorch, which differed from
    the graph by up to 0.4 of the outputs' peak) and agrees with the graph within 1e-4 of
    each output's peak at every size whose padded side is one patch."""
    backbone = randomised(lambda: PolaViT(
        arch=ARCH,
        out_indices=(0, 1, 2),
        final_norm=False,
        interpolate_mode='bicubic',
        drop_path_rate=0.1))
    model = ExportableModel(backbone, 'backbone')
    assert model.training and not backbone.training
    path = str(tmp_path / 'vit_upernet.onnx')
    export_onnx(model, path, (64, 64), dynamic=True, opset=11)
    assert model.training and not any(m.training for m in backbone.modules())
    rows = compare_onnxruntime(model, path, ONE_PATCH_HW)
    assert len(rows) == 3 * len(ONE_PATCH_HW)
    for row in rows:
        assert row.max_rel < 1e-4, row
    assert model.training and not backbone.training  # the flags given back after the check
