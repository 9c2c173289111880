"""Warm start of Pola backbones from softmax checkpoints (polaformer_mm.models.warm_start),
on files made from mmdet's own modules in mmdet's and the official release layouts."""
import re

import pytest
import torch
import torch.nn.functional as F
from mmengine.logging import MMLogger

from polaformer_mm.models import PolaPVT, PolaPVTv2, PolaSwin, PolaViT
from polaformer_mm.models.attention import PolaLinearAttention
from polaformer_mm.models.warm_start import WarmStartError, warm_start
from polaformer_mm.models.warm_start.report import tensor_kind
from ._softmax_files import (PVT_POLA, PVTV2_POLA, SWIN_POLA, VIT_POLA, deit_release_layout,
                             mmdet_pvt, mmdet_pvtv2, mmdet_swin, mmpretrain_deit,
                             pvt_release_layout, pvtv2_release_layout, save, swin_release_layout)

pytest.importorskip('mmdet')
POLA_ONLY = {
    'attn.power', 'attn.scale', 'attn.positional_encoding', 'attn.dwc.weight', 'attn.dwc.bias'
}

KINDS = ['pvt', 'swin', 'pvtv2', 'vit']
FIXED = dict(
    pvt=(PolaPVT, PVT_POLA),
    swin=(PolaSwin, SWIN_POLA),
    pvtv2=(PolaPVTv2, PVTV2_POLA),
    vit=(PolaViT, VIT_POLA))


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    """The softmax files: mmdet's PVT, PVTv2 and Swin and mmpretrain's DeiT (whole-model
    style, 'backbone.'), and the official release layouts made from the same weights."""
    folder = tmp_path_factory.mktemp('softmax')
    out = dict(pvt=mmdet_pvt(), swin=mmdet_swin(), pvtv2=mmdet_pvtv2(), vit=mmpretrain_deit())
    releases = dict(
        pvt=pvt_release_layout,
        swin=swin_release_layout,
        pvtv2=pvtv2_release_layout,
        vit=deit_release_layout)
    for kind, to_release in releases.items():
        state_dict = {k: v.clone() for k, v in out[kind].state_dict().items()}
        out[f'{kind}_mmdet'] = save(folder / f'{kind}_mm.pth', state_dict, 'backbone.')
        out[f'{kind}_release'] = save(folder / f'{kind}_release.pth', to_release(state_dict))
    return out


def _pola(kind, letter, seed=0, **kwargs):
    """The test's Pola backbone of ``kind``, every block ``letter`` ('L' / 'S') unless
    ``attn_types`` is given."""
    cls, fixed = FIXED[kind]
    kwargs.setdefault('attn_types', letter if kind == 'vit' else letter * 4)
    torch.manual_seed(seed)
    return cls(**{**fixed, **kwargs})


def test_release_layouts_are_what_mmdet_reads(files):
    """The release-layout files of the tests are what mmdet's own readers take back to
    the mmdet modules' state dicts (so they are in the release layouts)."""
    from mmdet.models.backbones.pvt import pvt_convert
    from mmdet.models.backbones.swin import swin_converter
    for kind in ('pvt', 'pvtv2'):
        pvt = pvt_convert(torch.load(files[f'{kind}_release'], weights_only=True)['state_dict'])
        assert pvt.keys() == files[kind].state_dict().keys()
        for key, value in files[kind].state_dict().items():
            torch.testing.assert_close(pvt[key], value, rtol=0, atol=0)
    swin = swin_converter(torch.load(files['swin_release'], weights_only=True)['state_dict'])
    # the final norm: mmdet's reader keeps its release name, 'norm'
    swin = {re.sub(r'^backbone\.norm\.', 'backbone.norm3.', k): v for k, v in swin.items()}
    own = files['swin'].state_dict()
    assert {
        k[len('backbone.'):]
        for k in swin
    } == set(own) - {
        'norm0.weight', 'norm0.bias', 'norm1.weight', 'norm1.bias', 'norm2.weight', 'norm2.bias'
    }
    for key, value in swin.items():
        torch.testing.assert_close(value, own[key[len('backbone.'):]], rtol=0, atol=0)


def _align_pvt_norm_eps(model):
    """PolaPVT keeps the PVT release's LayerNorm eps in the patch embeddings and the
    spatial reductions (1e-5); mmdet's PVT uses 1e-6 everywhere."""
    aligned = ('patch_embed.norm', 'reduction.norm')
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm) and name.endswith(aligned):
            module.eps = 1e-6


CLASSIFIER = dict(
    pvt={'cls_token', 'norm.weight', 'norm.bias', 'head.weight', 'head.bias'},
    swin={'head.weight', 'head.bias'},
    pvtv2={'head.weight', 'head.bias'},
    vit={'head.weight', 'head.bias'})
SIZES = dict(
    pvt=[(64, 64), (96, 128)],
    pvtv2=[(64, 64), (97, 131)],
    vit=[(64, 64), (96, 80)],
    swin=[(128, 128), (128, 192)])  # Swin: maps larger than and multiples of the window


@pytest.mark.parametrize('layout', ['mmdet', 'release'])
@pytest.mark.parametrize('kind', KINDS)
def test_all_softmax_warm_start_is_the_upstream_model(files, kind, layout):
    """Every block 'S': the warm-started backbone is mmdet's / mmpretrain's (its
    outputs), nothing is new, and the only unused file tensors are the classifier's
    (release files) and Swin's index buffers."""
    # a classification release of Swin holds the final norm only
    last_only = kind == 'swin' and layout == 'release'
    model = _pola(kind, 'S', **(dict(out_indices=(3, )) if last_only else {}))
    report = warm_start(model, files[f'{kind}_{layout}'], log=False)
    assert not report.new and not report.partial
    buffers = {k for k in report.unused if k.endswith('relative_position_index')}
    assert set(report.unused) - buffers == (set() if layout == 'mmdet' else CLASSIFIER[kind])
    assert len(buffers) == (5 if kind == 'swin' else 0)  # one per Swin block
    if kind == 'pvt':
        _align_pvt_norm_eps(model)
    for hw in SIZES[kind]:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            theirs = files[kind](x)
            for ours, want in zip(model.eval()(x), theirs[-1:] if last_only else theirs):
                torch.testing.assert_close(ours, want, rtol=0, atol=5e-5)


def test_distilled_deit_release(files, tmp_path):
    """A distilled DeiT release: the distillation token, its position row and its head
    are dropped; the rest gives mmpretrain's DeiT."""
    state_dict = {k: v.clone() for k, v in files['vit'].state_dict().items()}
    path = save(tmp_path / 'deit_distilled.pth', deit_release_layout(state_dict, distilled=True))
    model = _pola('vit', 'S')
    report = warm_start(model, path, log=False)
    assert set(
        report.unused) == CLASSIFIER['vit'] | {'dist_token', 'head_dist.weight', 'head_dist.bias'}
    assert report.loaded['pos_embed'] == ['pos_embed (distillation-token row dropped)']
    torch.testing.assert_close(model.pos_embed, files['vit'].pos_embed, rtol=0, atol=0)


def _softmax_projections(softmax):
    """The (weight, bias) of q, k and v of a softmax attention: ours (``q`` / ``kv``,
    ``qkv``), mmdet's PVTv2 one (``attn.in_proj_*``), mmpretrain's (``qkv``)."""
    if hasattr(softmax, 'qkv'):
        weight, bias = softmax.qkv.weight, softmax.qkv.bias
    elif hasattr(softmax, 'kv'):
        weight = torch.cat([softmax.q.weight, softmax.kv.weight])
        bias = torch.cat([softmax.q.bias, softmax.kv.bias])
    else:
        weight, bias = softmax.attn.in_proj_weight, softmax.attn.in_proj_bias
    return list(zip(weight.chunk(3), bias.chunk(3)))


def _softmax_out(softmax):
    return softmax.proj if hasattr(softmax, 'proj') else softmax.attn.out_proj


@pytest.mark.parametrize('kind', KINDS)
def test_every_loaded_tensor_equals_its_source(files, kind):
    """All 'L': every tensor outside attention equals the upstream-equivalent 'S'
    model's, and every Pola attention projects (PolaLinearAttention.project) the q, k
    and v of the softmax attention at its place, and has its output projection."""
    pola, softmax = _pola(kind, 'L'), _pola(kind, 'S')
    report = warm_start(pola, files[f'{kind}_mmdet'], log=False)
    warm_start(softmax, files[f'{kind}_mmdet'], log=False)
    own, ref = pola.state_dict(), softmax.state_dict()
    attention = [n for n, m in pola.named_modules() if isinstance(m, PolaLinearAttention)]
    assert len(attention) == (3 if kind == 'vit' else 5)
    for key in report.loaded:
        if not key.startswith(tuple(f'{p}.' for p in attention)):
            torch.testing.assert_close(own[key], ref[key], rtol=0, atol=0)
    gen = torch.Generator().manual_seed(3)
    for path in attention:
        attn, soft = pola.get_submodule(path), softmax.get_submodule(path)
        x = torch.randn(2, 64, attn.embed_dims, generator=gen)
        with torch.no_grad():
            q, k, v, _, _, _ = attn.project(
                x, (8, 8), pos_encoding=torch.zeros(1, 1, attn.embed_dims))
            scale = F.softplus(attn.scale).view(1, attn.num_heads, 1, attn.head_dims)
            for ours, (weight, bias) in zip((q * scale, k * scale, v), _softmax_projections(soft)):
                theirs = F.linear(x, weight, bias)
                theirs = theirs.reshape(2, 64, attn.num_heads, attn.head_dims).transpose(1, 2)
                torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(attn.proj.weight, _softmax_out(soft).weight, rtol=0, atol=0)
        torch.testing.assert_close(attn.proj.bias, _softmax_out(soft).bias, rtol=0, atol=0)


def test_pvt_reductions_of_the_same_ratio_are_loaded(files):
    """PolaPVT with la_sr_ratios = the arch's sr_ratios takes the softmax reductions
    (conv and norm), and leaves no file tensor unused."""
    pola = _pola('pvt', 'L', la_sr_ratios=(8, 4, 2, 1))
    report = warm_start(pola, files['pvt_release'], log=False)
    assert set(report.unused) == CLASSIFIER['pvt']
    file = torch.load(files['pvt_release'], weights_only=True)['state_dict']
    for stage, block in ((0, 0), (1, 1), (2, 0)):
        reduction = pola.layers[stage].blocks[block].attn.reduction
        torch.testing.assert_close(
            reduction.sr.weight, file[f'block{stage + 1}.{block}.attn.sr.weight'], rtol=0, atol=0)
        torch.testing.assert_close(
            reduction.norm.bias, file[f'block{stage + 1}.{block}.attn.norm.bias'], rtol=0, atol=0)


@pytest.mark.parametrize('kind', KINDS)
def test_pola_only_tensors_are_a_fresh_models_init(files, kind):
    """Through init_cfg: the tensors the report calls new, and the gate rows of the
    partly loaded ones, equal those of a fresh model built and initialised with the
    same seed; the report names the Pola-only kinds."""
    fresh = _pola(kind, 'L', seed=5)
    fresh.init_weights()
    warm = _pola(
        kind, 'L', seed=5, init_cfg=dict(type='WarmStart', checkpoint=files[f'{kind}_release']))
    warm.init_weights()
    report = warm.warm_start_report
    new_kinds = {tensor_kind(k) for k in report.new}
    partial_kinds = {tensor_kind(k) for k in report.partial}
    # a classification release of Swin has no output norms but the final one
    output_norms = {f'norm{i}.{p}' for i in range(3) for p in ('weight', 'bias')}
    assert new_kinds == POLA_ONLY | (output_norms if kind == 'swin' else set())
    assert partial_kinds == ({'attn.qg.weight', 'attn.qg.bias'}
                             if kind.startswith('pvt') else {'attn.qkvg.weight', 'attn.qkvg.bias'})
    a, b = fresh.state_dict(), warm.state_dict()
    for key in report.new:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0)
    for key, why in report.partial.items():
        start, stop = (int(s) for s in re.search(r'gate rows (\d+):(\d+)', why).groups())
        torch.testing.assert_close(b[key][start:stop], a[key][start:stop], rtol=0, atol=0)
        assert not torch.equal(b[key][:start], a[key][:start])
    counts = report.counts()
    assert counts['loaded'] + counts['partial'] + counts['new'] == len(b)
    unused = set(report.unused.values())
    if kind.startswith('pvt'):  # la_sr_ratios 1: the reductions have no counterpart
        assert 'spatial reduction by 8; the Pola attention has none' in unused
    elif kind == 'swin':
        assert 'relative position bias (Pola attention has none)' in unused
    else:
        assert unused == {'classifier head'}


def test_init_cfg_logs_the_report(files, tmp_path):
    log_file = tmp_path / 'warm.log'
    MMLogger.get_instance('test_warm_start_log', log_file=str(log_file))
    model = _pola(
        'swin',
        'L',
        attn_types='LLSS',
        init_cfg=dict(type='WarmStart', checkpoint=files['swin_mmdet'], prefix='backbone.'))
    model.init_weights()
    text = log_file.read_text()
    assert "PolaSwin(arch=" in text and "mmdet's / mmpretrain's SwinTransformer" in text
    assert re.search(r'\d+ tensors loaded, 6 loaded in part, 15 new', text), text
    assert 'new: attn.dwc.bias x3, attn.dwc.weight x3' in text


def test_mmpretrain_classifier_file(tmp_path):
    """A whole mmpretrain ImageClassifier file (SwinTransformer backbone, linear head):
    the 'backbone.' part is found, the head is unused, the output norms the classifier
    lacks are new."""
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmpretrain'):  # as mmpretrain's Runner does
        classifier = MODELS.build(
            dict(
                type='ImageClassifier',
                backbone=dict(
                    type='SwinTransformer',
                    arch=dict(embed_dims=16, depths=[1, 2, 1, 1], num_heads=[1, 2, 4, 8]),
                    window_size=2,
                    img_size=64),
                neck=dict(type='GlobalAveragePooling'),
                head=dict(type='LinearClsHead', num_classes=10, in_channels=128)))
    torch.manual_seed(0)
    for p in classifier.parameters():
        torch.nn.init.normal_(p)
    path = save(tmp_path / 'mmpretrain_swin.pth', classifier.state_dict())
    model = _pola('swin', 'L', attn_types='LLSS')
    report = warm_start(model, path, log=False)
    assert report.layout == "mmdet's / mmpretrain's SwinTransformer"
    assert {k for k in report.unused if k.startswith('head.')} == {'head.fc.weight', 'head.fc.bias'}
    assert report.unused['head.fc.weight'] == "outside prefix 'backbone.'"
    assert {k
            for k in report.new if k.startswith('norm')
            } == {f'norm{i}.{p}'
                  for i in range(3)
                  for p in ('weight', 'bias')}
    merge = classifier.backbone.stages[2].downsample.reduction.weight
    assert report.loaded['stages.2.downsample.reduction.weight'] == [
        'backbone.stages.2.downsample.reduction.weight (input channels from the unfold order '
        'to the official one)'
    ]
    ours = model.stages[2].downsample.reduction.weight
    assert torch.equal(ours.sort(dim=1).values, merge.sort(dim=1).values)
    assert not torch.equal(ours, merge)


@pytest.mark.parametrize('kind,small,tiny', [('pvt', 'small', 'tiny'), ('pvtv2', 'b1', 'b0'),
                                             ('vit', 'deit-small', 'deit-tiny')])
def test_wrong_size_is_named(tmp_path, kind, small, tiny):
    """A file of the family's smaller model into a larger one: the error names the
    mismatch and the arch the file fits."""
    if kind == 'pvt':
        upstream = mmdet_pvt(num_layers=[2, 2, 2, 2], embed_dims=64, num_heads=[1, 2, 5, 8])
    elif kind == 'pvtv2':
        upstream = mmdet_pvtv2(num_layers=[2, 2, 2, 2], embed_dims=32, num_heads=[1, 2, 5, 8])
    else:
        upstream = mmpretrain_deit(arch='deit-tiny', img_size=224)
    path = save(tmp_path / f'{kind}_{tiny}.pth', upstream.state_dict())
    cls = FIXED[kind][0]
    model = cls(arch=small, attn_types='L' if kind == 'vit' else 'LLLL')
    with pytest.raises(
            WarmStartError,
            match=rf"does not fit {cls.__name__}\(arch='{small}'.*"
            rf"(missing keys|shape mismatches).*fits {cls.__name__} arch '{tiny}': "
            rf"set arch='{tiny}'"):
        warm_start(model, path, log=False)


@pytest.mark.parametrize('kind,other', [('pvt', 'swin'), ('swin', 'pvt'), ('pvt', 'pvtv2'),
                                        ('pvtv2', 'pvt'), ('vit', 'swin'), ('swin', 'vit')])
def test_wrong_family_is_named(files, kind, other):
    names = dict(pvt='PVT v1', swin='Swin', pvtv2='PVTv2', vit='DeiT / ViT')
    with pytest.raises(
            WarmStartError,
            match=f'is a {names[other]} checkpoint .* warm-starts '
            f'from {names[kind]} checkpoints'):
        warm_start(_pola(kind, 'L'), files[f'{other}_release'], log=False)


def test_other_files_are_named(files, tmp_path):
    pola_file = save(tmp_path / 'pola.pth', _pola('pvt', 'L').state_dict())
    with pytest.raises(WarmStartError, match='it is a Pola checkpoint.*Pretrained'):
        warm_start(_pola('pvt', 'L'), pola_file, log=False)
    unknown = save(tmp_path / 'unknown.pth', {'conv1.weight': torch.zeros(2, 3, 1, 1)})
    with pytest.raises(WarmStartError, match='its keys are in no PVT v1 softmax layout'):
        warm_start(_pola('pvt', 'L'), unknown, log=False)
    with pytest.raises(KeyError, match="no key of .* starts with prefix 'detector.'"):
        warm_start(_pola('pvt', 'L'), files['pvt_mmdet'], prefix='detector.', log=False)


def test_init_cfg_misuse_is_named(files):
    from mmdet.registry import MODELS
    with pytest.raises(
            ValueError,
            match=r"takes \['type', 'checkpoint', 'prefix'\]; got "
            r"unknown keys \['checkpiont'\]"):
        _pola('pvt', 'L', init_cfg=dict(type='WarmStart', checkpiont='x.pth')).init_weights()
    neck = MODELS.build(
        dict(
            type='FPN',
            in_channels=[8, 16],
            out_channels=8,
            num_outs=2,
            init_cfg=dict(type='WarmStart', checkpoint=files['pvt_mmdet'])))
    with pytest.raises(
            TypeError, match="type='WarmStart' warm-starts a Pola backbone.*set on "
            'a FPN'):
        neck.init_weights()


def test_deit_position_embedding_resized_to_the_backbones_size(files):
    """A DeiT file learned at 64x64 into a PolaViT pretrained at 96x96: the position embedding is
    resized as PolaViT resizes it on load, and the report says so."""
    model = _pola('vit', 'L', pretrain_img_size=96)
    report = warm_start(model, files['vit_release'], log=False)
    assert report.loaded['pos_embed'] == ['pos_embed (resized to (1, 37, 32))']
    reference = _pola('vit', 'S', pretrain_img_size=96)
    reference.load_state_dict(files['vit'].state_dict())  # PolaViT's own resizing on load
    torch.testing.assert_close(model.pos_embed, reference.pos_embed, rtol=0, atol=0)
