"""PolaPVTv2: with every stage 'S' it is mmdet's PyramidVisionTransformerV2 (its state
dicts load both ways, strictly, and the stage maps agree); mixed Pola / softmax stages at
any size; parameter counts, strict loads, stage freezing, checkpointing, the captured
form, FLOP counting and named errors."""
import math
import re

import pytest
import torch
from mmdet.models.backbones.pvt import PVTEncoderLayer, PyramidVisionTransformerV2

from polaformer_mm.models import PolaLinearAttention, PolaPVT, PolaPVTv2
from polaformer_mm.models.backbones import pola_pvtv2
from polaformer_mm.utils.capture import exportable
from polaformer_mm.utils.graph_forms import graph_forms

#: mmdet's PyramidVisionTransformerV2 arguments of each arch (configs/pvt/retinanet_pvtv2-b*)
MMDET_ARCHS = {
    'b0': dict(embed_dims=32, num_layers=[2, 2, 2, 2]),
    'b1': dict(embed_dims=64, num_layers=[2, 2, 2, 2]),
    'b2': dict(embed_dims=64, num_layers=[3, 4, 6, 3]),
    'b3': dict(embed_dims=64, num_layers=[3, 4, 18, 3]),
    'b4': dict(embed_dims=64, num_layers=[3, 8, 27, 3]),
    'b5': dict(embed_dims=64, num_layers=[3, 6, 40, 3], mlp_ratios=(4, 4, 4, 4)),
}
#: a small arch for the tests of behaviour (two blocks in stage 1)
SMALL = dict(
    embed_dims=[16, 32, 48, 64],
    depths=[1, 2, 1, 1],
    num_heads=[1, 2, 3, 4],
    mlp_ratios=[2, 2, 2, 2],
    sr_ratios=[8, 4, 2, 1])
THREE_STAGES = {k: v[:3] for k, v in SMALL.items()}


def _perturb(model, seed, scale=0.02):
    """Move every parameter off its initial value (unit norms, zero biases and the
    zero-initialised Pola parameters included), so that every one matters."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return model


@pytest.fixture(scope='module')
def mmdet_b0():
    """mmdet's PVTv2-b0 with weights of its own (its initialisation, seeded, perturbed)."""
    torch.manual_seed(0)
    model = PyramidVisionTransformerV2(**MMDET_ARCHS['b0'])
    model.init_weights()
    return _perturb(model, 1).eval()


def _max_diff(a, b):
    assert [x.shape for x in a] == [y.shape for y in b]
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def _outputs(model, hw, seed=0):
    x = torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x)


def _init_from(tmp_path, obj, **init_cfg):
    path = str(tmp_path / 'weights.pth')
    torch.save(obj, path)
    return dict(type='Pretrained', checkpoint=path, **init_cfg)


@pytest.mark.parametrize('form', ['bare', 'whole-model', 'whole-model-auto'])
def test_softmax_twin_loads_mmdet_pvtv2_strictly(mmdet_b0, form, tmp_path):
    """'SSSS' loads mmdet's state dict through init_cfg: bare, or a whole detector with
    prefix 'backbone.' (given, or found by itself); every tensor as mmdet's."""
    state = mmdet_b0.state_dict()
    if form == 'bare':
        obj, extra = state, {}
    else:
        obj = dict(
            state_dict={
                **{
                    f'backbone.{k}': v
                    for k, v in state.items()
                }, 'neck.lateral_convs.0.conv.weight': torch.zeros(8, 32, 1, 1)
            },
            meta=dict(mmdet_version='3.3.0'))
        extra = dict(prefix='backbone.') if form == 'whole-model' else {}
    model = PolaPVTv2(arch='b0', attn_types='SSSS', init_cfg=_init_from(tmp_path, obj, **extra))
    model.init_weights()
    own = model.state_dict()
    assert own.keys() == state.keys()
    assert all(torch.equal(own[k], v) for k, v in state.items())


@pytest.fixture(scope='module')
def twin_pairs(mmdet_b0, tmp_path_factory):
    """(ours, mmdet's) in both directions: our 'SSSS' loaded from mmdet's weights through
    init_cfg, and mmdet's PVTv2 loaded (strictly) from our own 'SSSS' weights."""
    path = str(tmp_path_factory.mktemp('mmdet') / 'pvtv2_b0.pth')
    torch.save(mmdet_b0.state_dict(), path)
    loaded = PolaPVTv2(
        arch='b0', attn_types='SSSS', init_cfg=dict(type='Pretrained', checkpoint=path))
    loaded.init_weights()
    torch.manual_seed(3)
    ours = PolaPVTv2(arch='b0', attn_types='SSSS')
    ours.init_weights()
    _perturb(ours, 4)
    ref = PyramidVisionTransformerV2(**MMDET_ARCHS['b0'])
    ref.load_state_dict(ours.state_dict(), strict=True)
    return {'mmdet-to-ours': (loaded.eval(), mmdet_b0), 'ours-to-mmdet': (ours.eval(), ref.eval())}


@pytest.mark.parametrize('direction', ['mmdet-to-ours', 'ours-to-mmdet'])
@pytest.mark.parametrize(
    'hw', [(224, 224),
           (97, 131), pytest.param((512, 512), marks=pytest.mark.slow)],
    ids=['224x224', '97x131', '512x512'])
def test_softmax_twin_gives_mmdets_maps(twin_pairs, direction, hw):
    """The oracle: with every stage 'S' and the same weights (mmdet's own, or ours
    loaded into mmdet's PVTv2) the stage maps are mmdet's within 1e-5."""
    ours, ref = twin_pairs[direction]
    got, want = _outputs(ours, hw), _outputs(ref, hw)
    assert [tuple(o.shape[2:]) for o in got
            ] == [(math.ceil(hw[0] / 2**(i + 2)), math.ceil(hw[1] / 2**(i + 2))) for i in range(4)]
    assert _max_diff(got, want) <= 1e-5


def test_initialisation_and_drop_path_are_mmdets():
    """Built and initialised from the same seed, 'SSSS' has mmdet's very weights; 'L'
    blocks take the drop-path rate of the mmdet block at their place."""
    torch.manual_seed(0)
    ref = PyramidVisionTransformerV2(**MMDET_ARCHS['b0'])
    ref.init_weights()
    torch.manual_seed(0)
    ours = PolaPVTv2(arch='b0', attn_types='SSSS')
    ours.init_weights()
    mine = ours.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in ref.state_dict().items())
    linear = PolaPVTv2(arch='b0', attn_types='LLLL')
    for i in range(4):
        for ref_block, block in zip(ref.layers[i][1], linear.layers[i][1]):
            rate = ref_block.ffn.dropout_layer.drop_prob
            assert block.attn.dropout_layer.drop_prob == block.ffn.dropout_layer.drop_prob == rate
    assert ref.layers[3][1][1].ffn.dropout_layer.drop_prob == pytest.approx(0.1)


def _official_pvtv2_layout(state):
    """An mmdet PVTv2 state dict in the layout of the official PVTv2 files
    (whai362/PVT ``pvt_v2_b*.pth``: ``patch_embed1.proj``, ``block1.0.attn.q`` /
    ``attn.kv``, ``mlp.fc1`` linear, ``mlp.dwconv.dwconv``, ``norm1``, a classifier)."""
    out = {}
    for key, value in state.items():
        i, part, rest = re.match(r'layers\.(\d)\.(\d)\.(.+)$', key).groups()
        stage = int(i) + 1
        if part == '0':
            out[f'patch_embed{stage}.' + rest.replace('projection.', 'proj.')] = value
            continue
        if part == '2':
            out[f'norm{stage}.{rest}'] = value
            continue
        j, rest = rest.split('.', 1)
        prefix = f'block{stage}.{j}.'
        match = re.match(r'attn\.attn\.in_proj_(weight|bias)$', rest)
        if match:
            dims = value.shape[0] // 3
            out[prefix + f'attn.q.{match[1]}'] = value[:dims]
            out[prefix + f'attn.kv.{match[1]}'] = value[dims:]
            continue
        rest = rest.replace('attn.attn.out_proj.', 'attn.proj.')
        rest = rest.replace('ffn.layers.1.', 'mlp.dwconv.dwconv.')
        fc = re.match(r'ffn\.layers\.(0|4)\.(weight|bias)$', rest)
        if fc:
            rest = f"mlp.fc{1 if fc[1] == '0' else 2}.{fc[2]}"
            value = value.flatten(1) if fc[2] == 'weight' else value
        out[prefix + rest] = value
    out['head.weight'], out['head.bias'] = torch.zeros(1000, 256), torch.zeros(1000)
    return out


def test_official_pvtv2_files_load_through_mmdets_converter(mmdet_b0, tmp_path):
    official = _official_pvtv2_layout(mmdet_b0.state_dict())
    assert 'block1.0.attn.q.weight' in official and 'patch_embed1.proj.weight' in official
    model = PolaPVTv2(arch='b0', attn_types='SSSS', init_cfg=_init_from(tmp_path, official))
    model.init_weights()
    mine = model.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in mmdet_b0.state_dict().items())


def _count(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize('arch', [
    'b0', 'b1', 'b2',
    pytest.param('b3', marks=pytest.mark.slow),
    pytest.param('b4', marks=pytest.mark.slow),
    pytest.param('b5', marks=pytest.mark.slow)
])
def test_arch_layouts_are_mmdets(arch):
    """'SSSS' has mmdet's parameters, key for key and shape for shape; 'LLLL' differs
    in the modules at ``<block>.attn`` only, which are Pola attentions."""
    ref = PyramidVisionTransformerV2(**MMDET_ARCHS[arch])
    softmax = PolaPVTv2(arch=arch, attn_types='SSSS')
    shapes = {k: v.shape for k, v in softmax.state_dict().items()}
    assert shapes == {k: v.shape for k, v in ref.state_dict().items()}
    assert _count(softmax) == _count(ref)
    linear = PolaPVTv2(arch=arch, attn_types='LLLL')
    outside = {k: v.shape for k, v in linear.state_dict().items() if '.attn.' not in k}
    assert outside == {k: s for k, s in shapes.items() if '.attn.' not in k}
    blocks = [b for stage in linear.layers for b in stage[1]]
    assert len(blocks) == sum(MMDET_ARCHS[arch]['num_layers'])
    assert all(type(b.attn) is pola_pvtv2.PVTv2PolaAttention for b in blocks)
    assert all(isinstance(b, PVTEncoderLayer) for b in blocks)
    assert linear.num_features == [MMDET_ARCHS[arch]['embed_dims'] * h for h in (1, 2, 5, 8)]


@pytest.mark.parametrize(
    'attn_types,la_sr_ratios,sizes',
    [
        ('LLLL', '1111', [(1, 1), (31, 17), (97, 131)]),
        pytest.param('LLSS', '8421', [(800, 1333)], marks=pytest.mark.slow),
        ('LLLL', '8421', [(5, 7), (97, 131)]),
        # 'S' stage 2 (sr 2) needs >= 17 pixels, stage 3 (sr 1) any
        ('LLSS', '1111', [(17, 23), (97, 131), (512, 512)]),
        ('SLSL', '8421', [(29, 45), (61, 33)]),
    ])
def test_mixed_stages_run_at_any_size(attn_types, la_sr_ratios, sizes):
    torch.manual_seed(0)
    model = PolaPVTv2(arch='b0', attn_types=attn_types, la_sr_ratios=la_sr_ratios)
    model.init_weights()
    _perturb(model, 1).eval()
    for stage, kind in zip(model.layers, attn_types):
        layer = pola_pvtv2.PVTv2SoftmaxLayer if kind == 'S' else pola_pvtv2.PVTv2PolaLayer
        assert all(type(block) is layer for block in stage[1])
    for hw in sizes:
        outs = _outputs(model, hw)
        assert [tuple(o.shape) for o in outs] == [(1, c, math.ceil(hw[0] / 2**(i + 2)),
                                                   math.ceil(hw[1] / 2**(i + 2)))
                                                  for i, c in enumerate([32, 64, 160, 256])]
        assert all(o.is_contiguous() and torch.isfinite(o).all() for o in outs)


def test_softmax_stage_below_its_reduction_is_named_where_mmdet_fails(mmdet_b0):
    """mmdet's reduction floors the map: an 'S' stage needs a map of sr_ratio per side
    (stage 0, sr 8: images of 29 pixels). Below, mmdet fails in its convolution and we
    name the stage; from there on both run alike."""
    model = PolaPVTv2(arch='b0', attn_types='SSSS')
    model.load_state_dict(mmdet_b0.state_dict())
    model.eval()
    with pytest.raises(RuntimeError):
        _outputs(mmdet_b0, (28, 64))
    with pytest.raises(
            ValueError,
            match=r"stage 0 is softmax \('S'\) with sr_ratio 8, but its "
            r'map is \(7, 16\).*at least 29 pixels per side'):
        _outputs(model, (28, 64))
    assert _max_diff(_outputs(model, (29, 64)), _outputs(mmdet_b0, (29, 64))) <= 1e-5
    with pytest.raises(ValueError, match=r'stage 1 .* sr_ratio 4, .*at least 25 pixels'):
        _outputs(PolaPVTv2(arch='b0', attn_types='LSSS'), (24, 64))
    assert len(_outputs(PolaPVTv2(arch='b0', attn_types='LLLS'), (1, 1))) == 4


@pytest.mark.parametrize('attn_types,la_sr_ratios', [('SSSS', '1111'), ('SSLS', '1141'),
                                                     ('LLSS', '8421')])
def test_blocks_are_mmdets_layers_and_graph_forms_equal_eager(attn_types, la_sr_ratios):
    """Every block of every stage is mmdet's PVTEncoderLayer (its forward), the 'L' ones
    with a Pola attention in mmdet's call. Inside graph_forms (the exporters) the 'S'
    blocks take their opset-11 form and the Pola attention its channels-first form:
    the same maps, and the blocks get their own forward back on exit. The softmax forms
    agree within 1e-5, the Pola attention's channels-first form within the ONNX
    agreement bar (1e-4 of the largest value: at 64 x 64 stage 2 of 'SSLS' has one key)."""
    torch.manual_seed(0)
    model = PolaPVTv2(
        arch=SMALL, attn_types=attn_types, la_sr_ratios=la_sr_ratios, drop_path_rate=0.)
    model.init_weights()
    _perturb(model, 1, scale=0.1).eval()
    blocks = [block for stage in model.layers for block in stage[1]]
    assert len(blocks) == sum(SMALL['depths'])
    assert all(isinstance(block, PVTEncoderLayer) for block in blocks)
    assert all(type(block).forward is PVTEncoderLayer.forward for block in blocks)
    for stage, kind in zip(model.layers, attn_types):
        for block in stage[1]:
            assert isinstance(block.attn, PolaLinearAttention) == (kind == 'L')
    for hw in [(64, 64), (45, 71)]:
        eager = _outputs(model, hw)
        with exportable(), graph_forms(model) as names:
            captured = _outputs(model, hw)
        # the 'S' blocks and the 'L' blocks' attentions take their forms
        assert set(names) == {
            f'layers.{i}.1.{j}' + ('.attn' if kind == 'L' else '')
            for i, (kind, depth) in enumerate(zip(attn_types, SMALL['depths']))
            for j in range(depth)
        }
        bar = 1e-5 if 'L' not in attn_types else 1e-4 * max(o.abs().max().item() for o in eager)
        assert _max_diff(eager, captured) <= bar
    assert not any('forward' in vars(m) for m in model.modules())


def _save_state(tmp_path, model, name):
    path = str(tmp_path / name)
    torch.save(model.state_dict(), path)
    return path


def test_strict_loads_and_named_mismatches(tmp_path):
    torch.manual_seed(0)
    mixed = _perturb(PolaPVTv2(arch='b0', attn_types='LLSS', la_sr_ratios='8421'), 1).eval()
    path = _save_state(tmp_path, mixed, 'llss.pth')
    same = PolaPVTv2(
        arch='b0',
        attn_types='LLSS',
        la_sr_ratios='8421',
        init_cfg=dict(type='Pretrained', checkpoint=path))
    same.init_weights()
    same.eval()
    assert _max_diff(_outputs(same, (45, 67)), _outputs(mixed, (45, 67))) == 0
    other_kind = PolaPVTv2(
        arch='b0',
        attn_types='LLLL',
        la_sr_ratios='8421',
        init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(
            KeyError, match=r'missing keys .*layers\.2\.1\.0\.attn\..*Check arch '
            'and attn_types'):
        other_kind.init_weights()
    other_ratio = PolaPVTv2(
        arch='b0', attn_types='LLSS', init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises((KeyError, ValueError), match=r'layers\.0\.1\.0\.attn'):
        other_ratio.init_weights()
    wider = PolaPVTv2(
        arch='b1',
        attn_types='LLSS',
        la_sr_ratios='8421',
        init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(
            ValueError,
            match=r'shape mismatches.*checkpoint \(32, 3, 7, 7\) vs '
            r'model \(64, 3, 7, 7\)'):
        wider.init_weights()
    pvt_v1 = _save_state(tmp_path, PolaPVT(arch='tiny'), 'pvt.pth')
    with pytest.raises(KeyError, match='does not fit this PolaPVTv2'):
        PolaPVTv2(arch='b0', init_cfg=dict(type='Pretrained', checkpoint=pvt_v1)).init_weights()
    with pytest.raises(KeyError, match="prefix 'model.'"):
        PolaPVTv2(
            arch='b0', init_cfg=dict(type='Pretrained', checkpoint=path,
                                     prefix='model.')).init_weights()


@pytest.mark.parametrize('kwargs,error,match', [
    (dict(arch='b9'), KeyError, r"Unknown PolaPVTv2 arch 'b9'; choose from \['b0', 'b1'"),
    (dict(arch=dict(embed_dims=[8] * 4, depths=[1] * 4, num_heads=[1] * 4, mlp_ratios=[1] * 4)),
     KeyError, 'misses keys .*sr_ratios'),
    (dict(arch={
        **SMALL, 'mlp_ratios': [2, 2, 0, 2]
    }), ValueError, r'arch mlp_ratios must be 4 numbers > 0'),
    (dict(arch=THREE_STAGES, attn_types='LLL',
          out_indices=(0, 1, 2)), ValueError, r'PolaPVTv2 has 4 stages; arch lists have 3 values'),
    (dict(arch={
        **SMALL, 'num_heads': [1, 2, 5, 4]
    }), ValueError, r'embed_dims 48 is not divisible by num_heads 5'),
    (dict(attn_types='LLX'), ValueError, r"attn_types must be 4 letters of 'L'/'S'"),
    (dict(la_sr_ratios=(1, 1)), ValueError, r'la_sr_ratios needs 4 values'),
    (dict(la_sr_ratios=(0, 1, 1, 1)), ValueError, r'la_sr_ratios must hold positive ints'),
    (dict(out_indices=(4, )), ValueError, r'out_indices must name stages in 0\.\.3'),
    (dict(frozen_stages=5), ValueError, r'frozen_stages must be in -1\.\.4'),
    (dict(drop_path_rate=1.5), ValueError, r'drop_path_rate must be in \[0, 1\)'),
    (dict(kernel_size=4), ValueError, r'kernel_size odd'),
    (dict(alpha=float('nan')), ValueError, r'alpha must be a finite number > 0'),
    (dict(pretrain_img_size=0), ValueError, r'pretrain_img_size must be a positive int'),
    (dict(init_cfg=dict(type='Pretrained', checkpoint='a.pth'),
          pretrained='b.pth'), ValueError, 'set init_cfg or pretrained, not both'),
])
def test_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        PolaPVTv2(**kwargs)


def test_bad_inputs_are_named():
    model = PolaPVTv2(arch='b0')
    with pytest.raises(ValueError, match=r'\(B, C, H, W\)'):
        model(torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match='expects 3 input channels'):
        model(torch.randn(1, 4, 32, 32))
    with pytest.raises(ValueError, match='empty batch or image'):
        model(torch.randn(0, 3, 32, 32))


def test_out_indices_pretrain_size_and_cfgs():
    model = PolaPVTv2(arch='b0', out_indices=(2, 0), pretrain_img_size=(96, 160))
    assert model.out_channels == [32, 160]
    outs = _outputs(model, (64, 64))
    assert [o.shape[1] for o in outs] == [32, 160]
    # the Pola positional encodings are learned on the pretraining grids (ceil)
    assert [s[1][0].attn.pos_grid for s in model.layers] == [(24, 40), (12, 20), (6, 10), (3, 5)]
    (out, ) = _outputs(PolaPVTv2(arch='b0', out_indices=3), (64, 64))
    assert out.shape == (1, 256, 2, 2)
    relu = PolaPVTv2(arch='b0', act_cfg=dict(type='ReLU'), norm_cfg=dict(type='LN', eps=1e-3))
    norms = [m for m in relu.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert sum(m.eps == 1e-3 for m in norms) == 4 + 4 + 8 * 2  # embeddings, stages, blocks
    assert isinstance(relu.layers[0][1][0].ffn.layers[2], torch.nn.ReLU)


@pytest.mark.parametrize('attn_types', ['LLSS', 'SLLS'])
def test_with_cp_same_outputs_and_gradients(attn_types):
    torch.manual_seed(0)
    ref = PolaPVTv2(arch=SMALL, attn_types=attn_types, la_sr_ratios='2111', drop_path_rate=0.)
    ref.init_weights()
    _perturb(ref, 1)
    ckpt = PolaPVTv2(
        arch=SMALL, attn_types=attn_types, la_sr_ratios='2111', drop_path_rate=0., with_cp=True)
    ckpt.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 70, 90)
    results = []
    for model in (ref, ckpt):
        model.train()
        outs = model(x)
        loss = sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs)
        loss.backward()
        results.append((outs, {n: p.grad.clone() for n, p in model.named_parameters()}))
    for a, b in zip(results[0][0], results[1][0]):
        torch.testing.assert_close(a, b)
    assert results[0][1].keys() == results[1][1].keys()
    for name, grad in results[0][1].items():
        torch.testing.assert_close(grad, results[1][1][name], msg=name)


@pytest.mark.parametrize('frozen_stages', [0, 1, 3])
def test_frozen_stages(frozen_stages):
    model = PolaPVTv2(arch=SMALL, attn_types='LSLS', frozen_stages=frozen_stages)
    model.train()
    frozen = [model.layers[0][0]] + [model.layers[i] for i in range(frozen_stages)]
    for module in frozen:
        assert not module.training
        assert all(not p.requires_grad for p in module.parameters())
    frozen_ids = {id(p) for m in frozen for p in m.parameters()}
    assert all(p.requires_grad for p in model.parameters() if id(p) not in frozen_ids)
    for i in range(frozen_stages, 4):
        assert model.layers[i][1].training
    outs = model(torch.randn(1, 3, 64, 64))  # drop path on: training mode
    sum(o.sum() for o in outs).backward()
    assert all(p.grad is None for m in frozen for p in m.parameters())
    assert all(p.grad is not None for p in model.parameters() if id(p) not in frozen_ids)


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_builds_from_each_registry(scope):
    import importlib
    registry = importlib.import_module(f'{scope}.registry').MODELS
    model = registry.build(dict(type='PolaPVTv2', arch='b0', attn_types='LLSS', out_indices=3))
    assert type(model) is PolaPVTv2
    assert model(torch.randn(1, 3, 64, 64))[0].shape == (1, 256, 2, 2)


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


@pytest.mark.slow
@pytest.mark.parametrize('attn_types,la_sr_ratios', [('LLLL', '1111'), ('LLSS', '8421')])
def test_get_flops_counts_the_attention(attn_types, la_sr_ratios, tmp_path, flop_table):
    """get_flops.py's logic (polaformer_mm.analysis.flops) counts every non-elementwise
    operator of PolaPVTv2, the Pola attention's products (matmul) included."""
    from mmengine.analysis import FlopAnalyzer

    from polaformer_mm.analysis.flops import measure_configs
    cfg = tmp_path / 'retinanet_pola-pvtv2-b0.py'
    cfg.write_text("custom_imports = dict(imports=['polaformer_mm'], "
                   "allow_failed_imports=False)\ndefault_scope = 'mmdet'\n"
                   f"model = dict(backbone=dict(type='PolaPVTv2', arch='b0', "
                   f"attn_types='{attn_types}', la_sr_ratios='{la_sr_ratios}'))\n")
    (row, ) = measure_configs([str(cfg)], (64, 96), False)
    assert row['uncounted'] == [] and row['shape'] == '64x96'
    assert row['backbone'] == 'PolaPVTv2 b0'
    backbone = PolaPVTv2(arch='b0', attn_types=attn_types, la_sr_ratios=la_sr_ratios).eval()
    assert row['params'] == _count(backbone)
    analyzer = FlopAnalyzer(backbone, (torch.randn(1, 3, 64, 96), ))
    analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    analyzer.set_op_handle(**{'aten::matmul': lambda inputs, outputs: 0})
    assert row['flops'] > analyzer.total() > 0


def test_la_sr_ratio_beyond_the_stage_map_is_named():
    """A reduction larger than its stage's map at pretrain_img_size would build a conv of
    C*C*r*r weights (la_sr_ratios=1000: a billion): a named error, with the largest ratio
    that fits; that ratio builds."""
    with pytest.raises(
            ValueError,
            match=r"la_sr_ratios\[0\]=1000 exceeds the side of stage 0's "
            r'56x56 map .*1,024,000,000 weights.*at most 56'):
        PolaPVTv2(arch='b0', la_sr_ratios=(1000, 1, 1, 1))
    with pytest.raises(ValueError, match=r'la_sr_ratios\[3\]=8 .* at most 7'):
        PolaPVTv2(arch='b0', la_sr_ratios=(1, 1, 1, 8))
    model = PolaPVTv2(arch='b0', la_sr_ratios=(56, 28, 14, 7))
    assert sum(p.numel() for p in model.parameters()) < 5 * 10**7  # 32M
    # an 'S' stage does not use la_sr_ratios
    PolaPVTv2(arch='b0', attn_types='LLLS', la_sr_ratios=(1, 1, 1, 8))


@pytest.mark.parametrize('attn_types', [[1, 2], ['L', 'L', 'S', 7], 5, None, 'LLX'])
def test_attn_types_errors_name_the_argument(attn_types):
    with pytest.raises(ValueError, match=r"attn_types must be 4 letters of 'L'/'S' .*got "):
        PolaPVTv2(arch='b0', attn_types=attn_types)
    assert PolaPVTv2(arch='b0', attn_types=['l', 'L', 'S', 'S']).attn_types == 'LLSS'
