"""Warm start of Pola backbones from softmax checkpoints (polaformer_mm.models.warm_start),
on files made from mmdet's own modules in mmdet's and the official release layouts."""
import re

import pytest
import torch
import torch.nn.functional as F
from mmengine.logging import MMLogger

from polaformer_mm.models import PolaPVT, PolaSwin
from polaformer_mm.models.attention import PolaLinearAttention
from polaformer_mm.models.warm_start import WarmStartError, warm_start
from polaformer_mm.models.warm_start.report import tensor_kind
from ._softmax_files import (PVT_POLA, SWIN_POLA, mmdet_pvt, mmdet_swin, pvt_release_layout,
                             save, swin_release_layout)

pytest.importorskip('mmdet')
POLA_ONLY = {'attn.power', 'attn.scale', 'attn.positional_encoding', 'attn.dwc.weight',
             'attn.dwc.bias'}


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    """The softmax files: mmdet's PVT and Swin (whole-detector style, 'backbone.'),
    and the official release layouts made from the same weights."""
    folder = tmp_path_factory.mktemp('softmax')
    pvt, swin = mmdet_pvt(), mmdet_swin()
    pvt_sd = {k: v.clone() for k, v in pvt.state_dict().items()}
    swin_sd = {k: v.clone() for k, v in swin.state_dict().items()}
    return dict(
        pvt=pvt,
        swin=swin,
        pvt_mmdet=save(folder / 'pvt_mmdet.pth', pvt_sd, 'backbone.'),
        pvt_release=save(folder / 'pvt_release.pth', pvt_release_layout(pvt_sd)),
        swin_mmdet=save(folder / 'swin_mmdet.pth', swin_sd, 'backbone.'),
        swin_release=save(folder / 'swin_release.pth', swin_release_layout(swin_sd)))


def _pola(kind, attn_types, seed=0, **kwargs):
    torch.manual_seed(seed)
    if kind == 'pvt':
        return PolaPVT(**{**PVT_POLA, **kwargs}, attn_types=attn_types)
    return PolaSwin(**{**SWIN_POLA, **kwargs}, attn_types=attn_types)


def test_release_layouts_are_what_mmdet_reads(files):
    """The release-layout files of the tests are what mmdet's own readers take back to
    the mmdet modules' state dicts (so they are in the release layouts)."""
    from mmdet.models.backbones.pvt import pvt_convert
    from mmdet.models.backbones.swin import swin_converter
    pvt = pvt_convert(torch.load(files['pvt_release'], weights_only=True)['state_dict'])
    assert pvt.keys() == files['pvt'].state_dict().keys()
    for key, value in files['pvt'].state_dict().items():
        torch.testing.assert_close(pvt[key], value, rtol=0, atol=0)
    swin = swin_converter(torch.load(files['swin_release'], weights_only=True)['state_dict'])
    # the final norm: mmdet's reader keeps its release name, 'norm'
    swin = {re.sub(r'^backbone\.norm\.', 'backbone.norm3.', k): v for k, v in swin.items()}
    own = files['swin'].state_dict()
    assert {k[len('backbone.'):] for k in swin} == set(own) - {'norm0.weight', 'norm0.bias',
                                                               'norm1.weight', 'norm1.bias',
                                                               'norm2.weight', 'norm2.bias'}
    for key, value in swin.items():
        torch.testing.assert_close(value, own[key[len('backbone.'):]], rtol=0, atol=0)


def _align_pvt_norm_eps(model):
    """PolaPVT keeps the PVT release's LayerNorm eps in the patch embeddings and the
    spatial reductions (1e-5); mmdet's PVT uses 1e-6 everywhere."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm) and name.endswith(
            ('patch_embed.norm', 'reduction.norm')):
            module.eps = 1e-6


@pytest.mark.parametrize('layout', ['mmdet', 'release'])
@pytest.mark.parametrize('kind', ['pvt', 'swin'])
def test_all_softmax_warm_start_is_mmdet(files, kind, layout):
    """Every block 'S': the warm-started backbone is mmdet's (its outputs), nothing is
    new, and the only unused file tensors are the classifier's (release files)."""
    # a classification release of Swin holds the final norm only
    last_only = kind == 'swin' and layout == 'release'
    model = _pola(kind, 'SSSS', **(dict(out_indices=(3, )) if last_only else {}))
    report = warm_start(model, files[f'{kind}_{layout}'], log=False)
    assert not report.new and not report.partial
    classifier = {'cls_token', 'norm.weight', 'norm.bias', 'head.weight', 'head.bias'}
    buffers = {k for k in report.unused if k.endswith('relative_position_index')}
    expected = set() if layout == 'mmdet' else classifier - ({'cls_token', 'norm.weight',
                                                             'norm.bias'} if kind == 'swin' else set())
    assert set(report.unused) - buffers == expected
    assert len(buffers) == (0 if kind == 'pvt' else 5)  # one per Swin block
    if kind == 'pvt':
        _align_pvt_norm_eps(model)
    sizes = [(64, 64), (96, 128)] if kind == 'pvt' else [(128, 128), (128, 192)]
    for hw in sizes:  # Swin: maps larger than and multiples of the window in every stage
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            theirs = files[kind](x)
            for ours, theirs in zip(model.eval()(x), theirs[-1:] if last_only else theirs):
                torch.testing.assert_close(ours, theirs, rtol=0, atol=5e-5)


def _softmax_qkv(softmax, x, hw):
    """The q, k, v tokens (B, n, C) of one of our softmax attentions ('S' blocks)."""
    if hasattr(softmax, 'qkv'):
        return softmax.qkv(x).chunk(3, dim=-1)
    q = softmax.q(x)
    if softmax.reduction is not None:
        x, _ = softmax.reduction(x, hw)
    return (q, *softmax.kv(x).chunk(2, dim=-1))


@pytest.mark.parametrize('kind', ['pvt', 'swin'])
def test_every_loaded_tensor_equals_its_source(files, kind):
    """All 'L': every tensor outside attention equals the mmdet-equivalent 'S' model's,
    and every Pola attention projects the softmax attention's q, k and v (the rows of
    its projections, through PolaLinearAttention.project) and has its output
    projection; PVT with la_sr_ratios = sr_ratios also takes the reductions."""
    extra = dict(la_sr_ratios=(8, 4, 2, 1)) if kind == 'pvt' else {}
    pola, softmax = _pola(kind, 'LLLL', **extra), _pola(kind, 'SSSS')
    report = warm_start(pola, files[f'{kind}_mmdet'], log=False)
    warm_start(softmax, files[f'{kind}_mmdet'], log=False)
    own, ref = pola.state_dict(), softmax.state_dict()
    attention = [n for n, m in pola.named_modules() if isinstance(m, PolaLinearAttention)]
    assert len(attention) == 5
    for key in report.loaded:
        if not key.startswith(tuple(f'{p}.' for p in attention)):
            torch.testing.assert_close(own[key], ref[key], rtol=0, atol=0)
    gen = torch.Generator().manual_seed(3)
    for path in attention:
        attn, soft = pola.get_submodule(path), softmax.get_submodule(path)
        hw = (8, 8)
        x = torch.randn(2, 64, attn.embed_dims, generator=gen)
        zero_pos = torch.zeros(1, 1, attn.embed_dims)
        with torch.no_grad():
            q, k, v, _, _, _ = attn.project(x, hw, pos_encoding=zero_pos)
            scale = F.softplus(attn.scale).view(1, attn.num_heads, 1, attn.head_dims)
            heads = [t.reshape(2, -1, attn.num_heads, attn.head_dims).transpose(1, 2)
                     for t in _softmax_qkv(soft, x, hw)]
        for ours, theirs in zip((q * scale, k * scale, v), heads):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(attn.proj.weight, soft.proj.weight, rtol=0, atol=0)
        if kind == 'pvt' and attn.reduction is not None:
            torch.testing.assert_close(attn.reduction.sr.weight, soft.reduction.sr.weight,
                                       rtol=0, atol=0)


@pytest.mark.parametrize('kind', ['pvt', 'swin'])
def test_pola_only_tensors_are_a_fresh_models_init(files, kind):
    """Through init_cfg: the tensors the report calls new, and the gate rows of the
    partly loaded ones, equal those of a fresh model built and initialised with the
    same seed; the report names the Pola-only kinds."""
    fresh = _pola(kind, 'LLLL', seed=5)
    fresh.init_weights()
    warm = _pola(kind, 'LLLL', seed=5, init_cfg=dict(type='WarmStart',
                                                     checkpoint=files[f'{kind}_release']))
    warm.init_weights()
    report = warm.warm_start_report
    new_kinds = {tensor_kind(k) for k in report.new}
    partial_kinds = {tensor_kind(k) for k in report.partial}
    # a classification release of Swin has no output norms but the final one
    output_norms = {f'norm{i}.{p}' for i in range(3) for p in ('weight', 'bias')}
    assert new_kinds == POLA_ONLY | (output_norms if kind == 'swin' else set())
    assert partial_kinds == ({'attn.qg.weight', 'attn.qg.bias'} if kind == 'pvt' else
                             {'attn.qkvg.weight', 'attn.qkvg.bias'})
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
    if kind == 'pvt':  # la_sr_ratios 1: the reductions have no counterpart
        assert 'spatial reduction by 8; the Pola attention has none' in unused
    else:
        assert 'relative position bias (Pola attention has none)' in unused


def test_init_cfg_logs_the_report(files, tmp_path):
    log_file = tmp_path / 'warm.log'
    MMLogger.get_instance('test_warm_start_log', log_file=str(log_file))
    model = _pola('swin', 'LLSS', init_cfg=dict(type='WarmStart',
                                                checkpoint=files['swin_mmdet'],
                                                prefix='backbone.'))
    model.init_weights()
    text = log_file.read_text()
    assert "PolaSwin(arch=" in text and "mmdet's / mmpretrain's SwinTransformer" in text
    assert re.search(r'\d+ tensors loaded, 6 loaded in part, 15 new', text), text
    assert 'new: attn.dwc.bias x3, attn.dwc.weight x3' in text


def test_mmpretrain_classifier_file(tmp_path):
    """A whole mmpretrain ImageClassifier file (SwinTransformer backbone, linear head):
    the 'backbone.' part is found, the head is unused, the output norms the classifier
    lacks are new."""
    from mmpretrain.registry import MODELS
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
    model = _pola('swin', 'LLSS')
    report = warm_start(model, path, log=False)
    assert report.layout == "mmdet's / mmpretrain's SwinTransformer"
    assert {k for k in report.unused if k.startswith('head.')} == {'head.fc.weight',
                                                                   'head.fc.bias'}
    assert report.unused['head.fc.weight'] == "outside prefix 'backbone.'"
    assert {k for k in report.new if k.startswith('norm')} == {
        f'norm{i}.{p}' for i in range(3) for p in ('weight', 'bias')}
    merge = classifier.backbone.stages[2].downsample.reduction.weight
    assert report.loaded['stages.2.downsample.reduction.weight'] == [
        'backbone.stages.2.downsample.reduction.weight (input channels from the unfold order '
        'to the official one)']
    ours = model.stages[2].downsample.reduction.weight
    assert torch.equal(ours.sort(dim=1).values, merge.sort(dim=1).values)
    assert not torch.equal(ours, merge)


def test_wrong_size_is_named(tmp_path):
    """A PVT-tiny file into a PolaPVT small: the error names the mismatch and the arch
    the file fits."""
    path = save(tmp_path / 'pvt_tiny.pth', mmdet_pvt(num_layers=[2, 2, 2, 2], embed_dims=64,
                                                     num_heads=[1, 2, 5, 8]).state_dict())
    model = PolaPVT(arch='small', attn_types='LLLL')
    with pytest.raises(WarmStartError, match=r"does not fit PolaPVT\(arch='small'.*missing keys"
                       r".*fits PolaPVT arch 'tiny': set arch='tiny'"):
        warm_start(model, path, log=False)


@pytest.mark.parametrize('kind', ['pvt', 'swin'])
def test_wrong_family_is_named(files, kind):
    other = 'swin' if kind == 'pvt' else 'pvt'
    names = dict(pvt='PVT v1', swin='Swin')
    with pytest.raises(WarmStartError, match=f'is a {names[other]} checkpoint .* warm-starts '
                       f'from {names[kind]} checkpoints'):
        warm_start(_pola(kind, 'LLLL'), files[f'{other}_release'], log=False)


def test_other_files_are_named(files, tmp_path):
    pola_file = save(tmp_path / 'pola.pth', _pola('pvt', 'LLLL').state_dict())
    with pytest.raises(WarmStartError, match='it is a Pola checkpoint.*Pretrained'):
        warm_start(_pola('pvt', 'LLLL'), pola_file, log=False)
    unknown = save(tmp_path / 'unknown.pth', {'conv1.weight': torch.zeros(2, 3, 1, 1)})
    with pytest.raises(WarmStartError, match='its keys are in no PVT v1 softmax layout'):
        warm_start(_pola('pvt', 'LLLL'), unknown, log=False)
    with pytest.raises(KeyError, match="no key of .* starts with prefix 'detector.'"):
        warm_start(_pola('pvt', 'LLLL'), files['pvt_mmdet'], prefix='detector.', log=False)


def test_init_cfg_misuse_is_named(files):
    from mmdet.registry import MODELS
    with pytest.raises(ValueError, match=r"takes \['type', 'checkpoint', 'prefix'\]; got "
                       r"unknown keys \['checkpiont'\]"):
        _pola('pvt', 'LLLL', init_cfg=dict(type='WarmStart', checkpiont='x.pth')).init_weights()
    neck = MODELS.build(
        dict(type='FPN', in_channels=[8, 16], out_channels=8, num_outs=2,
             init_cfg=dict(type='WarmStart', checkpoint=files['pvt_mmdet'])))
    with pytest.raises(TypeError, match="type='WarmStart' warm-starts a Pola backbone.*set on "
                       'a FPN'):
        neck.init_weights()
