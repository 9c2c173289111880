import json
import math
import os.path as osp
import re

import pytest
import torch

from polaformer_mm import PolaPVT, PolaSwin
from polaformer_mm.models.attention import relative_position_index
from polaformer_mm.models.official_weights import convert_official_state_dict

SIZES = [(32, 32), (97, 131), (511, 511), (224, 320), (800, 1333)]


def _expected_shapes(model, hw):
    dims = model.num_features
    return [(1, dims[i], math.ceil(hw[0] / 2**(i + 2)), math.ceil(hw[1] / 2**(i + 2)))
            for i in range(4)]


@pytest.fixture(scope='module')
def tiny_models():
    torch.manual_seed(0)
    models = [
        PolaPVT(arch='tiny'),
        PolaSwin(arch='tiny'),  # official 56 / 28 windows for 'L' stages
        PolaSwin(arch='tiny', linear_window_size=None)  # global 'L' stages
    ]
    for m in models:
        m.init_weights()
        m.eval()
    return models


# COCO's 800x1333 takes half the module's time: the slow tier runs it
@pytest.mark.parametrize(
    'hw', [pytest.param(hw, marks=[pytest.mark.slow] if hw == (800, 1333) else []) for hw in SIZES],
    ids=[f'{h}x{w}' for h, w in SIZES])
def test_forward_any_size(tiny_models, hw):
    x = torch.randn(1, 3, *hw)
    for model in tiny_models:
        with torch.no_grad():
            outs = model(x)
        assert [tuple(o.shape) for o in outs] == _expected_shapes(model, hw)
        assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('arch', ['pvt', 'swin', 'swin-global'])
def test_outputs_are_contiguous_maps_for_mmcv_ops(tiny_models, arch):
    """The maps are plain contiguous NCHW, as mmdet's backbones return them: mmcv's
    compiled RoIAlign indexes its input as NCHW without looking at its strides, and a
    channels-last map (the token layout viewed as a map, which the FPN's convolutions
    keep) gave a Mask R-CNN scrambled RoI features. Checked through mmdet's FPN and RoI
    extractor, the path of every two-stage detector."""
    from mmdet.registry import MODELS as DET_MODELS
    model = tiny_models[['pvt', 'swin', 'swin-global'].index(arch)]
    x = torch.randn(2, 3, 96, 128)
    with torch.no_grad():
        outs = model(x)
    torch.manual_seed(0)
    neck = DET_MODELS.build(
        dict(type='FPN', in_channels=list(model.num_features), out_channels=16, num_outs=4))
    extractor = DET_MODELS.build(
        dict(
            type='SingleRoIExtractor',
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0),
            out_channels=16,
            featmap_strides=[4, 8, 16, 32]))
    rois = torch.tensor([[0, 4., 6., 40., 50.], [1, 30., 20., 120., 90.], [1, 0., 0., 16., 16.]])
    with torch.no_grad():
        feats = neck(outs)
        got = extractor(feats, rois)
        want = extractor([f.clone(memory_format=torch.contiguous_format) for f in feats], rois)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert all(o.is_contiguous() for o in outs)


def test_softmax_stages_and_spatial_reduction_at_odd_sizes():
    torch.manual_seed(0)
    pvt = PolaPVT(arch='tiny', attn_types='LLSS', la_sr_ratios=(8, 4, 2, 1)).eval()
    swin = PolaSwin(arch='tiny', attn_types='LSSS').eval()
    for hw in [(37, 53), (97, 131)]:
        x = torch.randn(2, 3, *hw)
        for model in (pvt, swin):
            with torch.no_grad():
                outs = model(x)
            assert [o.shape[2:] for o in outs] == [s[2:] for s in _expected_shapes(model, hw)]
            assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('hw', [(5, 6), (7, 3), (2, 7)])
def test_window_padding_is_masked(hw):
    """A map smaller than the window is padded to one window; padded tokens take no
    part: the result equals attention among the real tokens only."""
    torch.manual_seed(0)
    swin = PolaSwin(
        arch=dict(embed_dims=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4]), attn_types='SSSS')
    swin.init_weights()
    block = swin.stages[2].blocks[1]  # an odd (shift) block: no shift on small maps
    attn = block.attn
    H, W = hw
    C, heads, d = 64, attn.num_heads, attn.head_dims
    x = torch.randn(2, H * W, C)
    with torch.no_grad():
        y = block._window_attention(x, hw)
        pos = [r * 7 + c for r in range(H) for c in range(W)]
        bias = attn.relative_position_bias_table[relative_position_index(7)[pos][:, pos]]
        q, k, v = attn.qkv(x).reshape(2, H * W, 3, heads, d).permute(2, 0, 3, 1, 4)
        a = (q * d**-0.5) @ k.transpose(-2, -1) + bias.permute(2, 0, 1)
        ref = attn.proj((a.softmax(-1) @ v).transpose(1, 2).reshape(2, H * W, C))
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)


def test_masked_softmax_windows_make_no_subnormals():
    """Padded, shifted softmax windows: the masked weights are exact zeros, so no
    subnormal float reaches the output projection (subnormals slow CPU matrix
    products down several times; the official -100 mask gives exp(-100) ~ 4e-44)."""
    torch.manual_seed(0)
    swin = PolaSwin(
        arch=dict(embed_dims=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4]), attn_types='SSSS')
    swin.init_weights()
    block = swin.stages[2].blocks[1]
    seen = []
    block.attn.proj.register_forward_hook(lambda m, inp, out: seen.append(inp[0].detach()))
    tiny = torch.finfo(torch.float32).tiny
    with torch.no_grad():
        block._window_attention(torch.randn(1, 10 * 11, 64), (10, 11))  # padded to 14x14
    x = seen[0]
    assert x.shape[0] == 4  # 2x2 windows, shifted
    assert not ((x != 0) & (x.abs() < tiny)).any()


def test_out_indices_and_norms():
    swin = PolaSwin(arch='tiny', out_indices=(1, 3))
    assert hasattr(swin, 'norm1') and hasattr(swin, 'norm3')
    assert not hasattr(swin, 'norm0')
    outs = PolaPVT(arch='tiny', out_indices=(0, 2))(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [64, 320]


@pytest.mark.parametrize(
    'cls,kwargs',
    [
        (PolaPVT, {}),
        (PolaSwin, {}),
        (PolaSwin, dict(linear_window_size=8)),  # padded and shifted 'L' windows
        (PolaSwin, dict(linear_window_size=None)),
    ],
    ids=['pvt', 'swin', 'swin-w8', 'swin-global'])
def test_with_cp_same_outputs_and_gradients(cls, kwargs):
    torch.manual_seed(0)
    arch = (
        dict(
            embed_dims=[16, 32, 48, 64],
            depths=[1, 2, 1, 1],
            num_heads=[1, 2, 3, 4],
            mlp_ratios=[2, 2, 2, 2],
            sr_ratios=[8, 4, 2, 1]) if cls is PolaPVT else dict(
                embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8]))
    ref = cls(arch=arch, drop_path_rate=0., **kwargs)
    ref.init_weights()
    ckpt = cls(arch=arch, drop_path_rate=0., with_cp=True, **kwargs)
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


@pytest.mark.parametrize('cls,stage_attr', [(PolaPVT, 'layers'), (PolaSwin, 'stages')])
@pytest.mark.parametrize('frozen_stages', [0, 1, 3])
def test_frozen_stages(cls, stage_attr, frozen_stages):
    model = cls(arch='tiny', frozen_stages=frozen_stages)
    frozen_at_build = {n for n, p in model.named_parameters() if not p.requires_grad}
    model.train()
    assert frozen_at_build == {n for n, p in model.named_parameters() if not p.requires_grad}
    stages = getattr(model, stage_attr)
    frozen = [stages[0].patch_embed if cls is PolaPVT else model.patch_embed]
    frozen += [stages[i] for i in range(frozen_stages)]
    if cls is PolaSwin:
        frozen += [getattr(model, f'norm{i}') for i in range(frozen_stages)]
    for module in frozen:
        assert not module.training
        assert all(not p.requires_grad for p in module.parameters())
    frozen_ids = {id(p) for m in frozen for p in m.parameters()}
    assert all(p.requires_grad for p in model.parameters() if id(p) not in frozen_ids)
    for i in range(frozen_stages, 4):
        assert stages[i].blocks.training
    # a frozen stage gets no gradient from a training step
    outs = model(torch.randn(1, 3, 64, 64))
    sum(o.sum() for o in outs).backward()
    assert all(p.grad is None for m in frozen for p in m.parameters())


def _official_shapes(golden_dir):
    with open(osp.join(golden_dir, 'official_state_dict_shapes.json')) as f:
        return json.load(f)


@pytest.mark.parametrize('name', [
    'pola_pvt_tiny', 'pola_pvt_small', 'pola_pvt_medium', 'pola_pvt_large', 'pola_swin_tiny',
    'pola_swin_small', 'pola_swin_base'
])
def test_every_released_arch_matches_official_layout(golden_dir, name):
    shapes = _official_shapes(golden_dir)[name]
    kind, size = name.split('_')[1:]
    model = (PolaPVT if kind == 'pvt' else PolaSwin)(arch=size, out_indices=(3, ))
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}

    buffers = re.compile(r'(attn_mask|relative_position_index)$')
    unused = re.compile(r'^head\.' + (r'|^norm\.' if kind == 'pvt' else ''))
    official_count = sum(
        math.prod(s) for k, s in shapes.items() if not buffers.search(k) and not unused.search(k))
    assert sum(p.numel() for p in model.parameters()) == official_count

    fake = {k: torch.empty(s, device='meta') for k, s in shapes.items()}
    converted = {
        k[len('backbone.'):]: tuple(v.shape)
        for k, v in convert_official_state_dict(fake).items() if k.startswith('backbone.')
    }
    assert converted == ours


def test_bad_arguments_are_named():
    with pytest.raises(KeyError, match='huge'):
        PolaPVT(arch='huge')
    with pytest.raises(KeyError, match='sr_ratios'):
        PolaPVT(
            arch=dict(embed_dims=[8] * 4, depths=[1] * 4, num_heads=[1] * 4, mlp_ratios=[1] * 4))
    with pytest.raises(ValueError, match='attn_types'):
        PolaSwin(attn_types='LLX')
    with pytest.raises(ValueError, match='out_indices'):
        PolaSwin(out_indices=(4, ))
    with pytest.raises(ValueError, match='la_sr_ratios'):
        PolaPVT(la_sr_ratios=(1, 1))
    with pytest.raises(ValueError, match=r'\(B, C, H, W\)'):
        PolaPVT()(torch.randn(3, 32, 32))


def _swin_l_block(window, shifted, embed_dims=16, num_heads=2):
    from polaformer_mm.models.backbones.pola_swin import SwinBlock
    block = SwinBlock(
        embed_dims,
        num_heads,
        attn_type='L',
        shifted=shifted,
        linear_window_size=window,
        pos_grid=(window, window),
        mlp_ratio=2.)
    for p in block.parameters():  # the Pola parameters start at zero: randomise all
        torch.nn.init.normal_(p, std=0.3)
    return block.double().eval()


def test_linear_window_padded_tokens_take_no_part():
    """Whatever the padded tokens hold, the outputs of the real tokens stay the same."""
    torch.manual_seed(0)
    attn = _swin_l_block(8, False).attn
    padding = torch.rand(3, 64) < 0.4
    padding[0] = False  # one window without padding
    x = torch.randn(3, 64, 16, dtype=torch.float64)
    garbage = torch.where(padding[..., None], 1e3 * torch.randn_like(x), x)
    with torch.no_grad():
        a = attn(x, (8, 8), padding_mask=padding)
        b = attn(garbage, (8, 8), padding_mask=padding)
    real = ~padding
    torch.testing.assert_close(a[real], b[real], rtol=0, atol=1e-12)


@pytest.mark.parametrize('hw', [(5, 6), (8, 3), (1, 1)])
def test_linear_window_padding_equals_the_unpadded_map(hw):
    """A map padded into a larger window gives, on its real tokens, exactly what the
    unpadded map gives (the same P positions, no padded keys, the depthwise conv
    seeing zeros beyond the map as at a window border)."""
    torch.manual_seed(0)
    H, W = hw
    block = _swin_l_block(8, True)  # shifted, but a map smaller than the window is not
    x = torch.randn(2, H * W, 16, dtype=torch.float64)
    with torch.no_grad():
        padded = block._window_attention(x, hw)
        # the same attention without padding: P cropped to the map
        from polaformer_mm.models.attention import PolaLinearAttention
        exact = PolaLinearAttention(16, 2, pos_grid=hw, family='swin').double()
        state = block.attn.state_dict()
        state['positional_encoding'] = state['positional_encoding'].reshape(1, 8, 8,
                                                                            16)[:, :H, :W].reshape(
                                                                                1, H * W, 16)
        exact.load_state_dict(state)
        ref = exact(x, hw)
    torch.testing.assert_close(padded, ref, rtol=0, atol=1e-12)


def test_linear_window_shift_follows_the_official_rule():
    """Odd blocks shift by half a window when the map exceeds the window along both
    sides (padding does not change which tokens share a window before the roll)."""
    from polaformer_mm.models.window_geometry import window_shift
    assert window_shift((112, 112), 56, True) == 28
    assert window_shift((56, 56), 56, True) == 0
    assert window_shift((200, 334), 56, True) == 28
    assert window_shift((40, 334), 56, True) == 0
    assert window_shift((200, 334), 56, False) == 0
    torch.manual_seed(0)
    model = PolaSwin(
        arch=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8]),
        linear_window_size=56)
    assert [b.window_size for b in model.stages[0].blocks] == [56, 56]
    assert [b.window_size for b in model.stages[1].blocks] == [28, 28]
    assert [b.window_size for b in model.stages[2].blocks] == [7, 7]
    assert tuple(model.stages[1].blocks[1].attn.pos_grid) == (28, 28)
    glob = PolaSwin(
        arch=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8]),
        linear_window_size=None)
    assert all(b.window_size is None for b in glob.stages[0].blocks)


@pytest.mark.parametrize('form', [96, None])
def test_swin_base_384_official_layout(golden_dir, form):
    """The official 384 Swin-B (WINDOW_SIZE 96, 'S' windows 12): its key layout
    converts and loads into PolaSwin(pretrain_img_size=384) in both forms."""
    shapes = dict(_official_shapes(golden_dir)['pola_swin_base'])
    for key in list(shapes):
        if key.endswith('positional_encoding'):
            stage = int(key.split('.')[1])
            shapes[key] = [1, (96 // 2**stage)**2, 128 * 2**stage]
        elif key.endswith('relative_position_bias_table'):
            shapes[key] = [23 * 23, shapes[key][1]]
        elif key.endswith('relative_position_index'):
            shapes[key] = [144, 144]
    model = PolaSwin(
        arch='base',
        pretrain_img_size=384,
        window_size=12,
        linear_window_size=form,
        out_indices=(3, ))
    fake = {k: torch.zeros(s) for k, s in shapes.items()}
    converted = {
        k[len('backbone.'):]: v
        for k, v in convert_official_state_dict(fake).items() if k.startswith('backbone.')
    }
    model.load_state_dict(converted, strict=True)
    assert [b.window_size for b in model.stages[0].blocks] == [form, form]


@pytest.mark.parametrize('kwargs,match', [
    (dict(la_sr_ratios=(0, 1, 1, 1)), r'la_sr_ratios'),
    (dict(la_sr_ratios=4), r'la_sr_ratios must be a list'),
    (dict(patch_size=0), r'patch_size must be a positive int'),
    (dict(
        arch=dict(
            embed_dims=[8] * 4, depths=[1] * 4, num_heads=[1] * 4, mlp_ratios=[1]
            * 4, sr_ratios=8)), r'arch sr_ratios must be a list'),
    (dict(
        arch=dict(
            embed_dims=[8] * 4,
            depths=[1, 0, 1, 1],
            num_heads=[1] * 4,
            mlp_ratios=[1] * 4,
            sr_ratios=[1] * 4)), r'arch depths'),
    (dict(pretrain_img_size=8), r'pretrain_img_size=\(8, 8\) is too small'),
    (dict(la_sr_ratios=(8, 8, 8, 8)), r'la_sr_ratios\[3\]=8 exceeds stage 3'),
    (dict(alpha=float('nan')), r'alpha must be a finite number > 0'),
    (dict(alpha=-0.5), r'alpha must be a finite number > 0'),
    (dict(kernel_size=4), r'kernel_size odd'),
    (dict(drop_path_rate=1.5), r'drop_path_rate must be in \[0, 1\)'),
])
def test_pvt_arguments_are_checked_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PolaPVT(**kwargs)


@pytest.mark.parametrize('kwargs,match', [
    (dict(window_size=0), r'window_size must be a positive int'),
    (dict(window_size=-7), r'window_size must be a positive int'),
    (dict(linear_window_size=0), r'linear_window_size must be a positive int'),
    (dict(patch_size=0), r'patch_size must be a positive int'),
    (dict(pretrain_img_size=16), r'too small for patch_size=4 and 4 stages'),
    (dict(arch=dict(embed_dims=16, depths=[1] * 4, num_heads=3)), r'arch num_heads must be a list'),
    (dict(arch=dict(embed_dims=16, depths=[1] * 4, num_heads=[1, 2, 3, 4])), r'not divisible'),
    (dict(alpha=0), r'alpha must be a finite number > 0'),
    (dict(mlp_ratio=0), r'mlp_ratio must be > 0'),
])
def test_swin_arguments_are_checked_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PolaSwin(**kwargs)


@pytest.mark.parametrize('cls', [PolaPVT, PolaSwin])
def test_out_indices_int_is_one_stage_and_wrong_types_are_named(cls):
    one = cls(arch='tiny', out_indices=3)  # as mmdet's and mmpretrain's backbones take it
    assert one.out_indices == (3, )
    (out, ) = one(torch.randn(1, 3, 64, 64))
    assert out.shape[1] == one.num_features[3] == one.out_channels[0]
    assert cls(arch='tiny', out_indices=(2, 0)).out_channels == one.num_features[0:3:2]
    from mmdet.registry import MODELS  # as a config builds it
    for kwargs, match in [
        (dict(frozen_stages='2'), r"frozen_stages must be an int in -1\.\.4 \(-1: nothing "
         r"frozen\), got '2' \(str\)"),
        (dict(frozen_stages=1.0), r'frozen_stages must be an int .* got 1\.0 \(float\)'),
        (dict(out_indices='3'), r"out_indices must be an int or a list/tuple of ints \(stages "
         r"0\.\.3\), got '3' \(str\)"),
        (dict(out_indices=(1, None)), r'out_indices must be an int or a list/tuple of ints'),
    ]:
        with pytest.raises(TypeError, match=match):
            MODELS.build(dict(type=cls.__name__, arch='tiny', **kwargs))


@pytest.mark.parametrize('cls', [PolaPVT, PolaSwin])
def test_empty_or_wrong_inputs_are_named(cls):
    model = cls(arch='tiny')
    with pytest.raises(ValueError, match=r'empty batch or image: input shape \(0, 3'):
        model(torch.randn(0, 3, 64, 64))
    with pytest.raises(ValueError, match='expects 3 input channels'):
        model(torch.randn(1, 4, 64, 64))


def test_norm_and_act_cfg_are_used():
    pvt = PolaPVT(arch='tiny', act_cfg=dict(type='ReLU'), norm_cfg=dict(type='LN', eps=1e-3))
    block = pvt.layers[0].blocks[0]
    assert isinstance(block.mlp.act, torch.nn.ReLU)
    assert block.norm1.eps == block.norm2.eps == 1e-3
    assert PolaPVT().layers[0].blocks[0].norm1.eps == 1e-6  # official default
    swin = PolaSwin(arch='tiny', act_cfg=dict(type='SiLU'), norm_cfg=dict(type='LN', eps=1e-4))
    assert isinstance(swin.stages[2].blocks[0].mlp.act, torch.nn.SiLU)
    norms = [m for m in swin.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(m.eps == 1e-4 for m in norms)


def _pvt_stage_with_resized_encodings():
    torch.manual_seed(0)
    model = PolaPVT(
        arch=dict(
            embed_dims=[16, 32, 48, 64],
            depths=[3, 1, 1, 1],
            num_heads=[1, 2, 3, 4],
            mlp_ratios=[2] * 4,
            sr_ratios=[8, 4, 2, 1]),
        la_sr_ratios=(2, 1, 1, 1))
    for attn in (b.attn for b in model.layers[0].blocks):
        torch.nn.init.normal_(attn.positional_encoding)
    return model


@pytest.mark.parametrize('mode', ['bilinear', 'bicubic'])
@pytest.mark.parametrize('src,dst', [((56, 56), (200, 334)), ((7, 7), (25, 42)),
                                     ((56, 56), (28, 17)), ((3, 5), (1, 1)), ((1, 1), (4, 6))])
def test_resize_token_grid_is_f_interpolate(mode, src, dst):
    """The two matrix products give F.interpolate's values and gradients (float64),
    as contiguous tokens."""
    import torch.nn.functional as F

    from polaformer_mm.models.utils import resize_token_grid
    tokens = torch.randn(2, src[0] * src[1], 5, dtype=torch.float64, requires_grad=True)
    grid = tokens.reshape(2, *src, 5).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=dst, mode=mode, align_corners=False)
    expected = expected.flatten(2).transpose(1, 2)
    ours = resize_token_grid(tokens, src, dst, mode)
    assert ours.is_contiguous() and ours.shape == expected.shape
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)
    weights = torch.randn_like(expected)
    g_expected, = torch.autograd.grad((expected * weights).sum(), tokens)
    g_ours, = torch.autograd.grad((ours * weights).sum(), tokens)
    torch.testing.assert_close(g_ours, g_expected, rtol=0, atol=1e-12)


def test_stage_resizes_every_block_encoding_in_one_call():
    """The batched resize gives each block what resizing its own P gives, and the
    gradients reach every block's own P."""
    from polaformer_mm.models.utils import StagePositionalEncodings, resize_token_grid
    model = _pvt_stage_with_resized_encodings()
    attns = [b.attn for b in model.layers[0].blocks]
    hw = (13, 19)  # key grid (7, 10) after the ratio-2 reduction
    encodings = StagePositionalEncodings()(attns, hw)
    for attn, enc in zip(attns, encodings):
        own = resize_token_grid(attn.positional_encoding, attn.pos_grid, (7, 10), mode='bicubic')
        # one batched product against one per block: the same maths, rounded by other kernels
        torch.testing.assert_close(enc, own, rtol=1e-5, atol=1e-6)
    sum((e * torch.randn_like(e)).sum() for e in encodings).backward()
    assert all(a.positional_encoding.grad.abs().sum() > 0 for a in attns)
    # the backbone's forward uses them: the same output as each block resizing alone
    x = torch.randn(1, 3, 52, 76)
    with torch.no_grad():
        batched = model(x)
        stage = model.layers[0]
        tokens, grid = stage.patch_embed(x)
        from polaformer_mm.models.utils import resize_token_grid as resize
        tokens = tokens + resize(stage.pos_embed, stage.pos_grid, grid, 'bilinear')
        for block in stage.blocks:
            tokens = block(tokens, grid)  # pos_encoding=None: resized in the module
    torch.testing.assert_close(batched[0].flatten(2).transpose(1, 2), tokens, rtol=0, atol=1e-6)


def test_stage_encodings_cached_without_gradients_until_a_parameter_changes():
    from polaformer_mm.models.utils import StagePositionalEncodings
    model = _pvt_stage_with_resized_encodings()
    attns = [b.attn for b in model.layers[0].blocks]
    cache = StagePositionalEncodings()
    with torch.no_grad():
        first = cache(attns, (13, 19))
        assert cache(attns, (13, 19)) is first  # kept
        assert cache(attns, (9, 9)) is not first  # another grid
        again = cache(attns, (13, 19))
        attns[1].positional_encoding.add_(1.)  # an optimizer step, a weight load
        updated = cache(attns, (13, 19))
    assert updated is not again
    torch.testing.assert_close(updated[1], again[1] + 1., rtol=0, atol=1e-5)
    # with gradients: computed anew, differentiable
    with_grad = cache(attns, (13, 19))
    assert with_grad is not updated and with_grad[0].requires_grad


@pytest.mark.parametrize('hw, pad', [((12, 17), 1), ((13, 17), 2)])
def test_token_map_convolutions_run_channels_last(hw, pad):
    """Patch embeddings and spatial reductions of a token map (channels-last view)
    convolve it channels-last (no plain copy of the map, tokens of the result
    contiguous), with the values and gradients of the plain convolution; plain inputs
    (images) take the plain path."""
    from polaformer_mm.models.utils import PatchEmbed, conv_token_map, nchw_to_nlc
    torch.manual_seed(0)
    H, W = hw
    conv = torch.nn.Conv2d(8, 16, kernel_size=2, stride=2).double()
    tokens = torch.randn(2, H * W, 8, dtype=torch.float64, requires_grad=True)
    grid = tokens.transpose(1, 2).reshape(2, 8, H, W)
    assert grid.is_contiguous(memory_format=torch.channels_last)
    weights = torch.randn(2, 16, H // 2, W // 2, dtype=torch.float64)
    out = conv_token_map(
        conv, grid[..., :H // 2 * 2, :W // 2 * 2].contiguous(memory_format=torch.channels_last))
    assert not out.is_contiguous() and nchw_to_nlc(out).is_contiguous()
    grads = torch.autograd.grad((out * weights).sum(), [tokens, conv.weight, conv.bias])
    ref = conv(grid.contiguous()[..., :H // 2 * 2, :W // 2 * 2])
    expected = torch.autograd.grad((ref * weights).sum(), [tokens, conv.weight, conv.bias])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for g, g_ref in zip(grads, expected):
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)
    image = torch.randn(1, 8, H, W, dtype=torch.float64)
    assert conv_token_map(conv, image).is_contiguous()
    embed = PatchEmbed(8, 16, patch_size=pad + 1).double()
    ref_tokens, ref_hw = embed(grid.contiguous())
    out_tokens, out_hw = embed(grid)
    assert out_hw == ref_hw
    torch.testing.assert_close(out_tokens, ref_tokens, rtol=1e-12, atol=1e-12)
