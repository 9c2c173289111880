"""PolaViT (Pola-DeiT): the softmax twin against mmpretrain's DeiT in both directions,
any input size, the class-token design, parameter counts, loading and arguments."""
import logging
import math
import warnings

import pytest
import torch
from mmengine.logging import MMLogger
from mmpretrain.models.backbones import VisionTransformer

from polaformer_mm.engine.checkpoint_fit import check_checkpoint_fits
from polaformer_mm.models import PolaViT
from polaformer_mm.models.backbones.pola_vit import GRID_KEY, PolaViTAttention
from polaformer_mm.models.utils import resize_token_grid
from polaformer_mm.ops.pola_attention.reference import pola_linear_attention_reference

OUT_INDICES = (2, 5, 8, 11)
# DeiT's own size, an odd size (the patch embedding pads to 7x9), mmseg's DeiT UperNet size
ORACLE_SIZES = [(224, 224), (97, 131), (512, 512)]
TINY = dict(embed_dims=32, num_layers=3, num_heads=2, feedforward_channels=64)
FOUR = dict(embed_dims=32, num_layers=4, num_heads=2, feedforward_channels=64)


def _mmpretrain_deit(arch='deit-small', seed=0, **kwargs):
    """mmpretrain's VisionTransformer with random weights of its own, in eval mode."""
    torch.manual_seed(seed)
    kwargs.setdefault('out_indices', list(OUT_INDICES))
    kwargs.setdefault('out_type', 'featmap')
    model = VisionTransformer(arch=arch, with_cls_token=True, **kwargs)
    model.eval()  # mmpretrain's train() returns None: do not chain
    _randomise(model)
    return model


def _randomise(model, std=0.05):
    """Every parameter random (the Pola ones start at zero)."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model


def _max_error(got, want):
    assert len(got) == len(want)
    errors = []
    for a, b in zip(got, want):
        assert a.shape == b.shape
        errors.append((a - b).abs().max().item())
    return max(errors)


_ORACLE_ARCHS = ['deit-tiny', pytest.param('deit-small', marks=pytest.mark.slow)]


@pytest.fixture(scope='module', params=_ORACLE_ARCHS)
def deit_pair(request):
    """mmpretrain's DeiT with random weights, and the all-'S' PolaViT that loaded its
    state dict strictly (DeiT-S in the slow tier)."""
    ref = _mmpretrain_deit(request.param)
    ours = PolaViT(arch=request.param, attn_types='S', out_indices=OUT_INDICES).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


@pytest.mark.parametrize('hw', ORACLE_SIZES, ids=[f'{h}x{w}' for h, w in ORACLE_SIZES])
def test_softmax_twin_gives_mmpretrain_deit_outputs(deit_pair, hw):
    ref, ours = deit_pair
    x = torch.randn(1, 3, *hw)
    with torch.no_grad():
        want, got = ref(x), ours(x)
    assert [o.shape[2:] for o in got] == [(math.ceil(hw[0] / 16), math.ceil(hw[1] / 16))] * 4
    assert _max_error(got, want) < 1e-5
    assert all(o.is_contiguous() for o in got)


def test_mmpretrain_loads_the_softmax_twin(deit_pair):
    """The other direction: mmpretrain's DeiT loads our all-'S' state dict strictly
    (weights of ours) and gives our outputs."""
    _, twin = deit_pair
    ours = _randomise(PolaViT(arch=twin.arch, attn_types='S', out_indices=OUT_INDICES).eval())
    ref = _mmpretrain_deit(twin.arch, seed=1)
    ref.load_state_dict(ours.state_dict(), strict=True)
    assert ours.state_dict().keys() == twin.state_dict().keys()
    x = torch.randn(1, 3, 97, 131)
    with torch.no_grad():
        assert _max_error(ours(x), ref(x)) < 1e-5


@pytest.mark.parametrize('whole', [False, True], ids=['bare', 'whole-model'])
def test_init_cfg_pretrained_loads_mmpretrain_files(tmp_path, whole):
    """A bare backbone state dict, and a whole-model file (``backbone.`` prefix and a
    head), load through init_cfg / pretrained, strictly, into the softmax twin."""
    ref = _mmpretrain_deit(TINY, out_indices=[1, 2])
    state = ref.state_dict()
    if whole:
        state = {f'backbone.{k}': v for k, v in state.items()}
        state['head.fc.weight'] = torch.zeros(10, 32)
        state = dict(state_dict=state, meta=dict(epoch=1))
    path = str(tmp_path / 'deit.pth')
    torch.save(state, path)
    init_cfgs = [dict(type='Pretrained', checkpoint=path)]
    if whole:
        init_cfgs.append(dict(type='Pretrained', checkpoint=path, prefix='backbone.'))
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        want = ref(x)
    for init_cfg in init_cfgs:
        ours = PolaViT(arch=TINY, attn_types='S', out_indices=(1, 2), init_cfg=init_cfg)
        ours.init_weights()
        with torch.no_grad():
            assert _max_error(ours.eval()(x), want) < 1e-5
    with pytest.warns(DeprecationWarning, match='pretrained is deprecated'):
        ours = PolaViT(arch=TINY, attn_types='S', out_indices=(1, 2), pretrained=path)
    ours.init_weights()
    with torch.no_grad():
        assert _max_error(ours.eval()(x), want) < 1e-5


def test_output_cls_token_and_final_norm_as_mmseg_and_mmpretrain():
    """output_cls_token gives [map, class token] pairs (mmseg's meaning); without
    final_norm the model is mmpretrain's ViT without it, and a file's final norm is
    left unused, as mmseg's ViT leaves it."""
    ref = _mmpretrain_deit(TINY, out_indices=[0, 2])
    raw = _mmpretrain_deit(TINY, out_indices=[0, 2], out_type='raw')
    raw.load_state_dict(ref.state_dict())
    ours = PolaViT(arch=TINY, attn_types='S', out_indices=(0, -1), output_cls_token=True)
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 48, 80)
    with torch.no_grad():
        got, maps, tokens = ours.eval()(x), ref(x), raw(x)
    assert [type(o) for o in got] == [list, list]
    assert _max_error([o[0] for o in got], maps) < 1e-5
    assert _max_error([o[1] for o in got], [t[:, 0] for t in tokens]) < 1e-5

    plain = _mmpretrain_deit(TINY, out_indices=[2], final_norm=False)
    ours = PolaViT(arch=TINY, attn_types='S', final_norm=False)
    assert not hasattr(ours, 'ln1')
    ours._load_pretrained(ref.state_dict(), 'a file with ln1')  # ln1.* left unused
    ours.load_state_dict(plain.state_dict(), strict=True)
    with torch.no_grad():
        assert _max_error(ours.eval()(x), plain(x)) < 1e-5


def test_a_file_of_another_size_loads_resized_as_mmpretrain_resizes_it():
    """A 224 file into a model pretrained at 64 x 96: the position embedding is resized
    on loading as mmpretrain resizes it (the same outputs), and so is every 'L'
    positional encoding."""
    ref224 = _mmpretrain_deit(TINY, out_indices=[2])
    ref = _mmpretrain_deit(TINY, out_indices=[2], img_size=(64, 96))
    ref.load_state_dict(ref224.state_dict())
    ours = PolaViT(arch=TINY, attn_types='S', pretrain_img_size=(64, 96))
    ours._load_pretrained(ref224.state_dict(), 'a file at 224')
    assert ours.pos_embed.shape == (1, 1 + 4 * 6, 32)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        assert _max_error(ours.eval()(x), ref(x)) < 1e-5
    # an all-'L' file at 224 into an all-'L' model at 64 x 96: P resized bicubically
    pola224 = _randomise(PolaViT(arch=TINY))
    pola = PolaViT(arch=TINY, pretrain_img_size=(64, 96))
    pola.load_state_dict(pola224.state_dict(), strict=True)
    want = resize_token_grid(pola224.layers[1].attn.positional_encoding.detach(), (14, 14), (4, 6),
                             'bicubic')
    torch.testing.assert_close(pola.layers[1].attn.positional_encoding.detach(), want)


SIZES = [(32, 32), (97, 131), (224, 320), (512, 512), (800, 1333)]


@pytest.fixture(scope='module')
def small_models():
    """Every block 'L', and mixed blocks, with every parameter random."""
    torch.manual_seed(0)
    models = [PolaViT(arch=FOUR, out_indices=(0, 1, 2, 3), attn_types=t) for t in ('L', 'LSLS')]
    return [_randomise(m, 0.2).eval() for m in models]


@pytest.mark.parametrize('hw', SIZES, ids=[f'{h}x{w}' for h, w in SIZES])
def test_forward_any_size(small_models, hw):
    x = torch.randn(1, 3, *hw)
    grid = (math.ceil(hw[0] / 16), math.ceil(hw[1] / 16))
    for model in small_models:
        with torch.no_grad():
            outs = model(x)
        assert [tuple(o.shape) for o in outs] == [(1, 32, *grid)] * 4
        assert all(torch.isfinite(o).all() and o.is_contiguous() for o in outs)


def test_deit_tiny_mixed_blocks_forward():
    """The real size, blocks of both kinds (one letter per block), at an odd size."""
    torch.manual_seed(0)
    model = PolaViT(arch='deit-tiny', out_indices=OUT_INDICES, attn_types='LSLSLLSSLLLS')
    assert [type(b.attn).__name__
            for b in model.layers[:2]] == ['PolaViTAttention', 'MultiheadAttention']
    model.init_weights()
    with torch.no_grad():
        outs = model.eval()(torch.randn(1, 3, 97, 131))
    assert [tuple(o.shape) for o in outs] == [(1, 192, 7, 9)] * 4
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('qkv_bias', [True, False])
def test_class_token_attention_is_as_documented(qkv_bias):
    """An 'L' attention of (1 + H*W) tokens: the patch queries by the Pola maths over
    all keys (the class token's without P) plus the local term on the grid, the class
    query by softmax over the same keys, one gate and projection for all; checked
    against the explicit-weights form of the maths (float64), in the eager form and in
    the channels-first form an ONNX export records."""
    torch.manual_seed(0)
    H, W, C, h = 3, 5, 16, 2
    d = C // h
    attn = PolaViTAttention(C, h, pos_grid=(4, 4), qkv_bias=qkv_bias).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(2, 1 + H * W, C, dtype=torch.float64)
    with torch.no_grad():
        got = attn(x, (H, W))
        got_channels_first = attn.forward_channels_first(x, (H, W))
        q, k, v, g = attn.qkvg(x).chunk(4, dim=-1)
        pos = resize_token_grid(attn.positional_encoding, (4, 4), (H, W), 'bicubic')
        k = torch.cat([k[:, :1], k[:, 1:] + pos], dim=1)
        q, k, v = (t.reshape(2, -1, h, d).transpose(1, 2) for t in (q, k, v))
        scale = torch.nn.functional.softplus(attn.scale).view(1, h, 1, d)
        patches = pola_linear_attention_reference(q[:, :, 1:] / scale, k / scale, v, attn.power,
                                                  attn.alpha)
        cls = ((q[:, :, :1] @ k.transpose(-2, -1)) * d**-0.5).softmax(-1) @ v
        out = torch.cat([cls, patches], dim=2).transpose(1, 2).reshape(2, -1, C)
        local = torch.nn.functional.conv2d(
            v[:, :, 1:].transpose(-2, -1).reshape(2 * h, d, H, W),
            attn.dwc.weight,
            attn.dwc.bias,
            padding=2,
            groups=d)
        out[:, 1:] += local.reshape(2, h * d, H * W).transpose(1, 2)
        want = attn.proj(out * g)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got_channels_first, want, rtol=1e-9, atol=1e-9)
    assert got_channels_first.is_contiguous()
    for form in (attn, attn.forward_channels_first):
        with pytest.raises(ValueError, match=r'expects \(B, 1 \+ 3\*5, 16\) tokens'):
            form(x[:, 1:], (H, W))


def _pola_extra_per_block(C, heads, grid, kernel_size=5):
    d = C // heads
    # qkvg beside qkv: one C x C gate (+ bias); the depthwise conv; power, scale, P
    return C * C + C + d * kernel_size**2 + d + C + C + grid * C


@pytest.mark.parametrize(
    'arch', ['deit-tiny', 'deit-small',
             pytest.param('deit-base', marks=pytest.mark.slow)])
def test_parameter_counts(arch):
    """All-'S' equals mmpretrain's DeiT; all-'L' adds the Pola parameters per block.
    The short aliases name the same sizes."""
    ref = VisionTransformer(arch=arch, out_type='featmap')
    twin = PolaViT(arch=arch, attn_types='S')
    pola = PolaViT(arch=arch)
    short = PolaViT(arch=arch.replace('deit-', '')[0], attn_types='S')
    count = sum(p.numel() for p in ref.parameters())
    assert sum(p.numel() for p in twin.parameters()) == count
    assert twin.state_dict().keys() == ref.state_dict().keys()
    C, heads = ref.embed_dims, ref.arch_settings['num_heads']
    assert sum(p.numel()
               for p in pola.parameters()) == count + 12 * _pola_extra_per_block(C, heads, 14 * 14)
    assert short.arch == pola.arch
    # an 'L' and an 'S' block differ only in the module at attn
    paths = {k for k in pola.state_dict() if '.attn.' not in k}
    assert paths == {k for k in twin.state_dict() if '.attn.' not in k}
    assert all(pola.state_dict()[k].shape == twin.state_dict()[k].shape for k in paths)
    assert {k.split('.attn.')[1]
            for k in pola.state_dict() if '.attn.' in k} == {
                'qkvg.weight', 'qkvg.bias', 'proj.weight', 'proj.bias', 'dwc.weight', 'dwc.bias',
                'power', 'scale', 'positional_encoding'
            }


def test_strict_loads_name_what_does_not_fit(tmp_path):
    twin = PolaViT(arch=TINY, attn_types='S')
    pola = PolaViT(arch=TINY)
    with pytest.raises(KeyError, match=r'missing keys .*layers\.0\.attn\.qkvg\.weight'):
        pola._load_pretrained(twin.state_dict(), 'softmax.pth')
    state = twin.state_dict()
    del state['layers.2.ln2.bias']
    with pytest.raises(KeyError, match=r'missing keys \[\'layers\.2\.ln2\.bias\'\]'):
        twin._load_pretrained(state, 'partial.pth')
    wide = PolaViT(arch=dict(TINY, embed_dims=48), attn_types='S')
    with pytest.raises(ValueError, match=r'shape mismatches.*cls_token'):
        twin._load_pretrained(wide.state_dict(), 'wide.pth')
    path = str(tmp_path / 'model.pth')
    torch.save(dict(state_dict={f'model.{k}': v for k, v in twin.state_dict().items()}), path)
    model = PolaViT(
        arch=TINY,
        attn_types='S',
        init_cfg=dict(type='Pretrained', checkpoint=path, prefix='backbone.'))
    with pytest.raises(KeyError, match="no key of .* starts with prefix 'backbone.'"):
        model.init_weights()


def test_frozen_stages_as_mmpretrain():
    model = PolaViT(arch=TINY, frozen_stages=2, attn_types='LSL')
    model.train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    ref = VisionTransformer(arch=TINY, frozen_stages=2, out_type='featmap')
    ref.train()
    twin = PolaViT(arch=TINY, frozen_stages=2, attn_types='S')
    assert {n
            for n, p in ref.named_parameters() if not p.requires_grad
            } == {n
                  for n, p in twin.named_parameters() if not p.requires_grad}
    assert {n.split('.')[0] for n in frozen} == {'cls_token', 'pos_embed', 'patch_embed', 'layers'}
    assert {n.split('.')[1] for n in frozen if n.startswith('layers')} == {'0', '1'}
    assert not model.layers[1].training and model.layers[2].training
    every = PolaViT(arch=TINY, frozen_stages=3)
    assert not any(p.requires_grad for p in every.parameters())
    assert all(p.requires_grad for p in PolaViT(arch=TINY, frozen_stages=0).parameters())


def test_with_cp_same_outputs_and_gradients():
    torch.manual_seed(0)
    ref = _randomise(PolaViT(arch=TINY, attn_types='LSL', out_indices=(0, 2)), 0.1)
    ckpt = PolaViT(arch=TINY, attn_types='LSL', out_indices=(0, 2), with_cp=True)
    ckpt.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 70, 90)
    results = []
    for model in (ref, ckpt):
        model.train()
        outs = model(x)
        sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs).backward()
        results.append((outs, {n: p.grad.clone() for n, p in model.named_parameters()}))
    for a, b in zip(results[0][0], results[1][0]):
        torch.testing.assert_close(a, b)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(grad, results[1][1][name], msg=name)
    assert results[0][1]['layers.0.attn.positional_encoding'].abs().sum() > 0


def test_out_indices_and_channels():
    model = PolaViT(arch=TINY, out_indices=-1)
    assert model.out_indices == (2, ) and model.out_channels == [32]
    model = PolaViT(arch=TINY, out_indices=[0, -2])
    assert model.out_indices == (0, 1)
    outs = model(torch.randn(1, 3, 40, 40))
    assert [tuple(o.shape) for o in outs] == [(1, 32, 3, 3)] * 2


def test_mmseg_upernet_with_multilevel_neck_takes_the_outputs():
    """The outputs feed mmseg's MultiLevelNeck and UPerHead as mmseg's DeiT configs
    wire them (four block outputs, rescaled 4, 2, 1, 0.5)."""
    from mmengine.registry import DefaultScope
    from mmseg.registry import MODELS
    model = PolaViT(arch="deit-tiny", out_indices=OUT_INDICES, pretrain_img_size=64).eval()
    with DefaultScope.overwrite_default_scope('mmseg'):  # as mmseg's Runner does
        neck = MODELS.build(
            dict(
                type='MultiLevelNeck',
                in_channels=[192] * 4,
                out_channels=32,
                scales=[4, 2, 1, 0.5]))
        head = MODELS.build(
            dict(
                type='UPerHead',
                in_channels=[32] * 4,
                in_index=[0, 1, 2, 3],
                pool_scales=(1, 2, 3, 6),
                channels=16,
                num_classes=5,
                norm_cfg=dict(type='BN', requires_grad=True)))
    head.eval()
    with torch.no_grad():
        logits = head(neck(model(torch.randn(1, 3, 64, 96))))
    assert logits.shape == (1, 5, 16, 24)


@pytest.mark.parametrize('scope', ['mmseg', 'mmdet', 'mmpretrain'])
def test_configs_build_it_in_every_scope(scope):
    import importlib
    registry = importlib.import_module(f'{scope}.registry').MODELS
    model = registry.build(dict(type='PolaViT', arch='deit-tiny', out_indices=(2, 5, 8, 11)))
    assert isinstance(model, PolaViT) and model.out_channels == [192] * 4


@pytest.mark.parametrize('kwargs,error,match', [
    (dict(arch='deit-huge'), KeyError, r"Unknown PolaViT arch 'deit-huge'"),
    (dict(arch=dict(embed_dims=32, num_layers=2)), KeyError, r'misses keys \[\'num_heads\''),
    (dict(arch=dict(TINY, num_heads=3)), ValueError, r'embed_dims 32 is not divisible'),
    (dict(arch=dict(TINY, num_layers=0)), ValueError, r'arch num_layers must be a positive int'),
    (dict(attn_types='LX'), ValueError, r"attn_types must be one letter 'L'/'S' for all 3"),
    (dict(attn_types='LL'), ValueError, r'or one per block'),
    (dict(out_indices=3), ValueError, r'out_indices must name blocks in 0\.\.2'),
    (dict(out_indices=(0, -4)), ValueError, r'out_indices must name blocks'),
    (dict(out_indices='2'), TypeError, r'out_indices must be an int or a list'),
    (dict(frozen_stages=4), ValueError, r'frozen_stages must be in -1\.\.3'),
    (dict(img_size=0), ValueError, r'img_size must be a positive int'),
    (dict(pretrain_img_size=(224, 0)), ValueError, r'pretrain_img_size must be a positive int'),
    (dict(patch_size=0), ValueError, r'patch_size must be a positive int'),
    (dict(interpolate_mode='nearest'), ValueError, r'interpolate_mode must be one of'),
    (dict(drop_path_rate=1.0), ValueError, r'drop_path_rate must be in \[0, 1\)'),
    (dict(alpha=0), ValueError, r'alpha must be a finite number > 0'),
    (dict(kernel_size=4), ValueError, r'kernel_size odd'),
])
def test_bad_arguments_are_named(kwargs, error, match):
    kwargs.setdefault('arch', TINY)
    with pytest.raises(error, match=match):
        PolaViT(**kwargs)


def test_bad_inputs_are_named():
    model = PolaViT(arch=TINY)
    with pytest.raises(ValueError, match=r'\(B, C, H, W\)'):
        model(torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match='expects 3 input channels'):
        model(torch.randn(1, 4, 32, 32))
    with pytest.raises(ValueError, match='empty batch or image'):
        model(torch.randn(0, 3, 32, 32))


@pytest.mark.parametrize('attn_types', [[1, 2], ['L', None], ['LS', 'L'], 3, 'LX'])
def test_attn_types_errors_name_the_argument(attn_types):
    """Anything but one letter 'L'/'S' per block (or one for all): a ValueError naming
    attn_types, what was given and what is allowed."""
    with pytest.raises(ValueError) as info:
        PolaViT(arch='deit-tiny', attn_types=attn_types)
    text = str(info.value)
    assert text.startswith("attn_types must be one letter 'L'/'S' for all 12 blocks"), text
    assert repr(attn_types) in text
    assert PolaViT(arch='deit-tiny', attn_types=['l'] * 12).attn_types == 'L' * 12


def test_parameters_do_not_depend_on_the_input_size():
    """Pola-DeiT-S has the same parameters whatever img_size says: the position embedding
    and every P lie on the 14x14 grid of pretrain_img_size=224 and are resized to the
    input's grid at run time; pretrain_img_size=512 gives the former 512 layout (32x32)."""
    counts = {}
    for img_size in (None, 224, 512):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            model = PolaViT(arch='deit-small', img_size=img_size)
        assert model.pos_embed.shape == (1, 1 + 14 * 14, 384)
        assert model.layers[0].attn.positional_encoding.shape == (1, 14 * 14, 384)
        counts[img_size] = sum(p.numel() for p in model.parameters())
    assert counts[224] == counts[512] == counts[None] == 24_372_096
    former = PolaViT(arch='deit-small', pretrain_img_size=512)
    assert sum(p.numel() for p in former.parameters()) == counts[224] + 13 * (1024 - 196) * 384


def test_an_img_size_that_would_have_set_other_grids_is_warned_about():
    with pytest.warns(
            UserWarning,
            match=r'img_size=\(512, 512\) no longer sizes .* 14x14 .* '
            r'pretrain_img_size=\(512, 512\) for the 32x32 grid'):
        PolaViT(arch=TINY, img_size=512)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        PolaViT(arch=TINY, img_size=224)
        PolaViT(arch=TINY, img_size=64, pretrain_img_size=64)


class _Records(logging.Handler):
    """The records of mmengine's current logger while in a ``with`` block."""

    def __enter__(self):
        self.records = []
        MMLogger.get_current_instance().addHandler(self)
        return self.records

    def __exit__(self, *exc):
        MMLogger.get_current_instance().removeHandler(self)

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize('side', [8, 32])
def test_a_file_of_the_former_layout_loads_resized_and_says_so(tmp_path, side):
    """A Pola file whose position embedding and P lie on another grid than that of
    pretrain_img_size (the former layout: the grid of img_size) loads, strictly and through
    init_cfg, with every grid resized to the model's, logged with the keys and both grids
    (a warning, with the pretrain_img_size that keeps the file's grid, where the file's is
    larger); built with that pretrain_img_size, the model loads it as it is."""
    old = _randomise(PolaViT(arch=TINY, attn_types='LSL', pretrain_img_size=16 * side))
    state = old.state_dict()
    path = str(tmp_path / 'old.pth')
    torch.save(state, path)
    P = 'layers.{0,2}.attn.positional_encoding'
    loads = [
        lambda m: m.load_state_dict(state, strict=True),
        lambda m: m._load_pretrained(state, path),
        lambda m: m.init_weights(),
    ]
    for load in loads:
        model = PolaViT(
            arch=TINY, attn_types='LSL', init_cfg=dict(type='Pretrained', checkpoint=path))
        with _Records() as records:
            load(model)
        said = [r for r in records if 'resized' in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in records]
        text = said[0].getMessage()
        assert f'pos_embed, {P}' in text and f"file's {side}x{side} grid" in text
        assert "this model's 14x14 (pretrain_img_size 224x224" in text
        if side > 14:
            assert said[0].levelno == logging.WARNING
            assert f'pretrain_img_size={16 * side}' in text
        else:
            assert said[0].levelno == logging.INFO
        for j in (0, 2):
            want = resize_token_grid(state[f'layers.{j}.attn.positional_encoding'], (side, side),
                                     (14, 14), 'bicubic')
            torch.testing.assert_close(model.layers[j].attn.positional_encoding.detach(), want)
    same = PolaViT(arch=TINY, attn_types='LSL', pretrain_img_size=16 * side)
    with _Records() as records:
        same.load_state_dict(state, strict=True)
    assert not [r for r in records if 'resized' in r.getMessage()]
    x = torch.randn(1, 3, 80, 48)
    with torch.no_grad():
        torch.testing.assert_close(same.eval()(x), old.eval()(x))


def _loads(model, state, path):
    """The ways a file reaches a PolaViT: a strict load_state_dict, the Pretrained load,
    init_cfg (``model`` built with it), and a whole model's strict check and load."""
    yield 'load_state_dict', lambda: model.load_state_dict(state, strict=True)
    yield '_load_pretrained', lambda: model._load_pretrained(state, path)
    yield 'init_cfg', model.init_weights

    def whole():
        wrapper = torch.nn.Module()
        wrapper.backbone = model
        whole_state = {f'backbone.{k}': v for k, v in state.items()}
        check_checkpoint_fits(wrapper, whole_state)
        wrapper.load_state_dict(whole_state, strict=True)

    yield 'whole model', whole


def test_a_file_learned_on_a_grid_that_is_not_square_is_read_on_its_grid(tmp_path):
    """A model of a 16x4 grid (pretrain_img_size 256x64) writes its grid beside its
    tables; an 8x8 model (64 tokens too) loads the file resized from 16x4, whichever way it
    is loaded, and gives the file's model's outputs at a 128x128 input (where that model
    resizes its tables to 8x8 at run time). Before, the 64 tokens were read as 8x8: outputs
    off by more than their peak. A square grid writes nothing (DeiT's and mmpretrain's
    state dicts stay as they are)."""
    src = _randomise(PolaViT(arch=TINY, attn_types='LSL', pretrain_img_size=(256, 64)), 0.3)
    state = src.state_dict()
    assert state[GRID_KEY].tolist() == [16, 4]
    assert GRID_KEY not in PolaViT(arch=TINY, pretrain_img_size=128).state_dict()
    path = str(tmp_path / 'rect.pth')
    torch.save(state, path)
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        want = src.eval()(x)
    peak = max(w.abs().max().item() for w in want)
    for how in ('load_state_dict', '_load_pretrained', 'init_cfg', 'whole model'):
        model = PolaViT(
            arch=TINY,
            attn_types='LSL',
            pretrain_img_size=128,
            init_cfg=dict(type='Pretrained', checkpoint=path))
        with _Records() as records:
            dict(_loads(model, state, path))[how]()
        said = [r.getMessage() for r in records if 'resized' in r.getMessage()]
        assert len(said) == 1 and "from the file's 16x4 grid to this model's 8x8" in said[0], \
            (how, said)
        with torch.no_grad():
            assert _max_error(model.eval()(x), want) < 1e-5 * peak, how


def test_a_file_without_a_grid_is_square_and_a_bad_grid_is_named():
    """A file of a square 8x8 model into a 16x4 model: read as 8x8 and resized (said in the
    log), the outputs of the file's model at a 256x64 input; a grid record that does not fit
    the tables is an error naming it."""
    src = _randomise(PolaViT(arch=TINY, pretrain_img_size=128), 0.3)
    model = PolaViT(arch=TINY, pretrain_img_size=(256, 64))
    with _Records() as records:
        model.load_state_dict(src.state_dict(), strict=True)
    said = [r.getMessage() for r in records if 'resized' in r.getMessage()]
    assert len(said) == 1 and "file's 8x8 grid to this model's 16x4" in said[0], said
    assert 'the file names no grid: its tables were read as square' in said[0]
    x = torch.randn(1, 3, 256, 64)
    with torch.no_grad():
        assert _max_error(model.eval()(x), src.eval()(x)) < 1e-4
    state = dict(src.state_dict(), **{GRID_KEY: torch.tensor([16, 5])})
    with pytest.raises(
            ValueError,
            match=r'pos_grid=\[16, 5\] of the file does not fit its '
            r'pos_embed \(1, 65, 32\) \(64 tokens on the grid, 80 expected\)'):
        model.load_state_dict(state)


def test_blocks_are_mmpretrain_layers_and_build_no_attention_they_discard(monkeypatch):
    """'S' blocks are mmpretrain's TransformerEncoderLayer with its own attention, left as
    mmpretrain built it; 'L' blocks build their Pola attention only: one attention module
    is built per block."""
    from mmpretrain.models.backbones.vision_transformer import TransformerEncoderLayer
    from mmpretrain.models.utils import MultiheadAttention
    from mmpretrain.models.utils import attention as mmpretrain_attention
    built = []
    for cls in (MultiheadAttention, PolaViTAttention):
        init = cls.__init__

        def counted(self, *args, _init=init, _cls=cls, **kwargs):
            built.append(_cls.__name__)
            _init(self, *args, **kwargs)

        monkeypatch.setattr(cls, '__init__', counted)
    model = PolaViT(arch=TINY, attn_types='LSS')
    assert built == ['PolaViTAttention', 'MultiheadAttention', 'MultiheadAttention']
    assert not isinstance(model.layers[0], TransformerEncoderLayer)
    for block in model.layers[1:]:
        assert isinstance(block, TransformerEncoderLayer)
        own = mmpretrain_attention.scaled_dot_product_attention
        assert block.attn.scaled_dot_product_attention is own


def test_graph_forms_compute_the_forward():
    """Inside graph_forms (as the exporters run the model) the 'L' attention takes its
    channels-first form and the 'S' block its opset-11 form: the same outputs."""
    from polaformer_mm.utils.graph_forms import graph_forms
    torch.manual_seed(0)
    model = _randomise(PolaViT(arch=TINY, attn_types='LSL', out_indices=(0, 1, 2)), 0.1).eval()
    x = torch.randn(2, 3, 50, 70)
    with torch.no_grad():
        want = model(x)
        with graph_forms(model) as names:
            got = model(x)
    assert names == ['layers.0.attn', 'layers.1', 'layers.2.attn']
    assert _max_error(got, want) < 1e-5
