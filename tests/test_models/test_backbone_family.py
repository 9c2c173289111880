"""A fifth backbone family defined here, in the test, and nowhere in the package: a tiny
Pola backbone class, its :class:`~polaformer_mm.models.family.BackboneFamily` (a softmax
checkpoint layout with key names of its own, a benchmark pair, config names, attention
names), registered for the tests of this file only. The warm start,
``benchmark_backbone.py``, ``get_flops.py``, ``visualize_attention.py`` and the gain table
take it through their ordinary entry points, without an edit of the package."""
import dataclasses
import json
import os.path as osp
import re
import warnings

import matplotlib
import pytest
import torch
from mmengine.registry import MODELS

from polaformer_mm.analysis.attention_sites import collect_pola_sites
from polaformer_mm.analysis.gain_table import make_gain_table
from polaformer_mm.analysis.loading import build_model, prepare_image
from polaformer_mm.engine.entry import load_config
from polaformer_mm.models.backbones import PolaPVT
from polaformer_mm.models.checkpoint_layouts import Builder, Converted, Layout, matches
from polaformer_mm.models.family import (BackboneFamily, families, family_of, register_family,
                                         unregister_family)
from polaformer_mm.models.warm_start import WarmStartError, warm_start
from tests import REPO
from .._tools import load_tool

#: the toy's name in mmengine's MODELS registry (unique to this test)
TOY_TYPE = 'PolaToyBackboneOfTestBackboneFamily'
IMAGE = osp.join(matplotlib.get_data_path(), 'sample_data', 'grace_hopper.jpg')
TOY_ARCH = dict(
    embed_dims=[8, 16, 24, 32],
    depths=[1, 1, 1, 1],
    num_heads=[1, 1, 2, 2],
    mlp_ratios=[2, 2, 2, 2],
    sr_ratios=[4, 2, 1, 1])


@MODELS.register_module(name=TOY_TYPE, force=True)
class PolaToy(PolaPVT):
    """The toy family's Pola backbone: a PVT-like backbone of width 8-32, one block per
    stage."""
    family = 'toy'
    arch_zoo = {'n': TOY_ARCH, 'nano': TOY_ARCH}


def toy(attn_types: str = 'LLLL', **kwargs) -> PolaToy:
    """A toy backbone at the size its configs use (positional encodings at 64 x 64)."""
    return PolaToy(arch='n', attn_types=attn_types, pretrain_img_size=64, **kwargs)


# the toy family's softmax release: the twin's keys under 'toy_layers.' instead of 'layers.'
_TOY_RELEASE = (r'^toy_layers\.\d+\.patch_embed\.proj\.weight$',
                r'^toy_layers\.\d+\.blocks\.\d+\.attn\.q\.weight$')


def _toy_release(state_dict) -> Converted:
    """The toy release's keys -> the twin's."""
    out = Builder()
    for key, value in state_dict.items():
        out.put(re.sub(r'^toy_layers\.', 'layers.', key), value, key)
    return out.result()


def _toy_benchmark():
    common = dict(type=TOY_TYPE, arch='n', pretrain_img_size=64, out_indices=(0, 1, 2, 3))
    return {
        'pola-toy-n': dict(scope=None, cfg=dict(common, attn_types='LLLL'), config='(a test)'),
        'toy-n': dict(scope=None, cfg=dict(common, attn_types='SSSS'), config='(a test)'),
    }


TOY_LAYOUT = 'the toy release (toy_layers.*)'
TOY = BackboneFamily(
    name='toy',
    title='Toy family',
    backbone=PolaToy,
    layouts=(Layout('toy', TOY_LAYOUT, lambda k: matches(k, *_TOY_RELEASE), _toy_release), ),
    config_name='toy',
    config_title='Toy',
    config_sizes='[n]',
    benchmark=_toy_benchmark,
    attention_names=r'(?:^|\.)layers\.(?P<stage>\d+)\.blocks\.(?P<block>\d+)\.attn$')

# Semantic FPN on the quickstart's synthetic data, the toy as its backbone, 64 x 64 input
SEG_CONFIG = """
_base_ = '{root}/configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py'
model = dict(
    backbone=dict(_delete_=True, type='{type}', arch='n', attn_types='{attn_types}',
                  pretrain_img_size=64, out_indices=(0, 1, 2, 3), init_cfg=None),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=16,
              norm_cfg=dict(type='GN', num_groups=4, requires_grad=True)),
    decode_head=dict(in_channels=[16] * 4, channels=16))
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(64, 64), keep_ratio=False),
    dict(type='PackSegInputs'),
]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
"""


@pytest.fixture
def toy_family():
    """The toy family, registered for one test."""
    assert 'toy' not in {f.name for f in families()}
    register_family(TOY)
    try:
        yield TOY
    finally:
        unregister_family('toy')


def _config(folder, name: str, attn_types: str) -> str:
    path = osp.join(str(folder), f'{name}.py')
    with open(path, 'w') as f:
        f.write(SEG_CONFIG.format(root=REPO, type=TOY_TYPE, attn_types=attn_types))
    return path


def test_registry_round_trip(toy_family):
    assert family_of(toy()) is toy_family
    assert family_of(PolaPVT).name == 'pvt'  # the parent class keeps its own family
    unregister_family('toy')
    try:
        assert family_of(PolaToy).name == 'pvt'  # no family of its own: its parent's
        with pytest.raises(KeyError, match="no backbone family 'toy'; registered: .*pvt"):
            unregister_family('toy')
    finally:
        register_family(toy_family)


def test_warm_start_reads_the_toy_layout(toy_family, tmp_path):
    """A softmax file in the toy's own layout warm-starts a toy: every tensor of the file
    is loaded, only the Pola attention's own tensors are new; a PVT file is refused with
    the family it belongs to named."""
    torch.manual_seed(0)
    softmax = toy('SSSS').state_dict()
    release = {'toy_layers.' + k[len('layers.'):]: v for k, v in softmax.items()}
    path = str(tmp_path / 'toy_softmax.pth')
    torch.save(release, path)

    model = toy('LLSS')
    report = warm_start(model, path, log=False)
    assert report.layout == TOY_LAYOUT
    # what the file has and the toy has no place for: the spatial reduction of its softmax
    # attention in the two Pola stages (sr_ratios 4 and 2, la_sr_ratios 1)
    assert {re.sub(r'\.(weight|bias)$', '', k)
            for k in report.unused} == {
                f'toy_layers.{i}.blocks.0.attn.reduction.{m}'
                for i in (0, 1)
                for m in ('sr', 'norm')
            }
    assert all(why.endswith('the Pola attention has none') for why in report.unused.values())
    assert report.new and set(report.new.values()) == {'Pola attention only'}
    pola = ('layers.0.blocks.0.attn.', 'layers.1.blocks.0.attn.')
    assert all(k.startswith(pola) for k in list(report.new) + list(report.partial))
    own = model.state_dict()
    for key in ('layers.0.patch_embed.proj.weight', 'layers.1.pos_embed',
                'layers.3.blocks.0.attn.q.weight', 'layers.2.blocks.0.mlp.fc1.weight'):
        assert report.loaded[key] == ['toy_' + key]
        assert torch.equal(own[key], softmax[key])
    # the Pola blocks' value projection comes from the softmax block's
    dims = TOY_ARCH['embed_dims'][0]
    assert torch.equal(own['layers.0.blocks.0.attn.kv.weight'][dims:],
                       softmax['layers.0.blocks.0.attn.kv.weight'][dims:])

    pvt = PolaPVT(arch=TOY_ARCH, attn_types='SSSS', pretrain_img_size=64)
    pvt_path = str(tmp_path / 'pvt_softmax.pth')
    torch.save(pvt.state_dict(), pvt_path)
    with pytest.raises(WarmStartError) as err:
        warm_start(toy('LLSS'), pvt_path, log=False)
    assert re.search(
        r"is a PVT v1 checkpoint \(PolaPVT with softmax stages\), but "
        r"PolaToy\(arch='n', attn_types='LLSS'\) warm-starts from Toy family checkpoints "
        r'\(the toy release \(toy_layers\.\*\)\); use the Pola backbone of the PVT v1 family',
        str(err.value)), str(err.value)
    # and the other way round: the toy's file into a PolaPVT names the toy family
    with pytest.raises(WarmStartError, match=r'is a Toy family checkpoint \(the toy release'):
        warm_start(PolaPVT(arch=TOY_ARCH, attn_types='LLSS', pretrain_img_size=64), path, log=False)


def test_benchmark_backbone_measures_the_toy_pair(toy_family, tmp_path):
    cli = load_tool('analysis_tools/benchmark_backbone.py', '_benchmark_backbone_toy')
    out = tmp_path / 'out'
    rc = cli.main([
        '--backbones', 'pola-toy-n', 'toy-n', '--sizes', '64x64', '--mode', 'forward', '--repeat',
        '1', '--warmup', '0', '--threads', '1', '--isolate', 'none', '--no-plot', '--out-dir',
        str(out)
    ])
    assert rc == 0
    data = json.loads((out / 'benchmark_backbone.json').read_text())
    assert data['backbones']['pola-toy-n']['cfg']['type'] == TOY_TYPE
    assert data['backbones']['toy-n']['cfg']['attn_types'] == 'SSSS'
    rows = {r['backbone']: r for r in data['results']}
    assert set(rows) == {'pola-toy-n', 'toy-n'}
    assert all(r['status'] == 'ok' and r['time_s'] > 0 for r in rows.values())
    params = {
        name: sum(p.numel() for p in toy(attn).parameters()) / 1e6
        for name, attn in (('pola-toy-n', 'LLLL'), ('toy-n', 'SSSS'))
    }
    assert {name: r['params_m'] for name, r in rows.items()} == pytest.approx(params)
    (ratio, ) = data['ratios']
    assert (ratio['pola'], ratio['baseline']) == ('pola-toy-n', 'toy-n')
    assert ratio['time'] == pytest.approx(rows['pola-toy-n']['time_s'] / rows['toy-n']['time_s'])
    table = (out / 'benchmark_backbone.md').read_text()
    assert f"| pola-toy-n | toy-n | forward | none | 64x64 | 1 | {ratio['time']:.2f} |" in table


def test_get_flops_counts_the_toy(toy_family, tmp_path, capsys):
    tool = load_tool('analysis_tools/get_flops.py', '_get_flops_toy')
    configs = [
        _config(tmp_path, 'fpn_pola-toy-n_synthetic-seg', 'LLLL'),
        _config(tmp_path, 'fpn_toy-n_synthetic-seg', 'SSSS')
    ]
    # at 256 x 256 the toy's FLOPs show in the table's 0.01 G steps
    tool.main(configs + ['--shape', '256', '--threads', '1'])
    printed = capsys.readouterr().out
    rows = [line.split(' | ') for line in printed.splitlines() if line.startswith(f'| {tmp_path}')]
    assert [r[1:4] for r in rows] == [[f'{TOY_TYPE} n', 'backbone', '256x256']] * 2
    for row, attn in zip(rows, ('LLLL', 'SSSS')):
        assert float(row[4]) == round(sum(p.numel() for p in toy(attn).parameters()) / 1e6, 2)
        assert float(row[5].rstrip(' |')) > 0
    assert 'not counted' not in printed


def test_visualize_attention_draws_the_toy_sites(toy_family, tmp_path):
    tool = load_tool('analysis_tools/visualize_attention.py', '_visualize_attention_toy')
    config = _config(tmp_path, 'fpn_pola-toy-n_synthetic-seg', 'LLSS')
    out = tmp_path / 'out'
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # the random-weights warning
        written = tool.main([config, IMAGE, '--out-dir', str(out), '--num-queries', '16'])
    summary = json.loads((out / 'attention.json').read_text())
    assert [(b['stage'], b['block']) for b in summary['blocks']] == [(0, 0), (1, 0)]
    assert [osp.basename(p)
            for p in written['blocks']] == ['attention_s0_b0.png', 'attention_s1_b0.png']
    assert all(osp.getsize(p) > 0 for p in written['blocks'])
    assert summary['random_weights'] and summary['input_shape'][-2:] == [64, 64]

    # the sites are found by the toy family's attention names, not by its parent's
    cfg = load_config(config)
    model = build_model(cfg, None, 'cpu', 0)
    inputs = prepare_image(cfg, model, IMAGE).inputs
    assert [(s.name, s.stage_hw) for s in collect_pola_sites(model.backbone, inputs)
            ] == [('layers.0.blocks.0.attn', (16, 16)), ('layers.1.blocks.0.attn', (8, 8))]
    unregister_family('toy')
    try:
        register_family(dataclasses.replace(TOY, attention_names=r'^toy\.(?P<block>\d+)$'))
        with pytest.raises(
                ValueError,
                match=r"layers\.0\.blocks\.0\.attn: a Pola attention "
                r"module outside the attention names of the PolaToy backbone's "
                r"family \('\^toy"):
            collect_pola_sites(model.backbone, inputs)
    finally:
        unregister_family('toy')
        register_family(TOY)


def _gain_table(folder, config_name: str):
    """The gain table of a Pola run and its all-softmax run of the toy (configs named
    ``fpn_[pola-]<config_name>-n_synthetic-seg``), from test records as tools/test.py
    writes them."""
    for pola, attn, miou in (('pola-', 'LLLL', 41.5), ('', 'SSSS', 40.0)):
        name = f'fpn_{pola}{config_name}-n_synthetic-seg'
        work_dir = folder / 'work_dirs' / name
        work_dir.mkdir(parents=True)
        config = _config(folder, name, attn)
        (work_dir / 'test_metrics.json').write_text(
            json.dumps(dict(config=config, metrics={'mIoU': miou}, tta=False)))
    return make_gain_table([str(folder / 'work_dirs')], flops=False)


def test_gain_table_labels_and_pairs_the_toy_runs(toy_family, tmp_path):
    rows = _gain_table(tmp_path, 'toy')
    assert [(r['backbone'], r['config']) for r in rows] == [
        ('Toy-N', 'fpn_toy-n_synthetic-seg'),
        ('Pola-Toy-N', 'fpn_pola-toy-n_synthetic-seg'),
        ('Pola-Toy-N - Toy-N', ''),
    ]
    assert rows[2]['mIoU'] == pytest.approx(1.5)
    params = [sum(p.numel() for p in toy(a).parameters()) / 1e6 for a in ('SSSS', 'LLLL')]
    assert [r['params_M'] for r in rows[:2]] == pytest.approx(params)
    assert rows[2]['params_M'] == pytest.approx(params[1] - params[0])


def test_gain_table_pairs_an_all_softmax_baseline_of_the_same_class(toy_family, tmp_path):
    """The toy family with config names 'mini-n' (before 'pola-' in the sort): the
    all-'S' run is the softmax row and pairs with the Pola run."""
    unregister_family('toy')
    try:
        register_family(dataclasses.replace(TOY, config_name='mini', config_title='Mini'))
        rows = _gain_table(tmp_path, 'mini')
    finally:
        unregister_family('toy')
        register_family(TOY)
    assert [(r['backbone'], r['row']) for r in rows] == [('Mini-N', 'softmax'),
                                                         ('Pola-Mini-N', 'pola'),
                                                         ('Pola-Mini-N - Mini-N', 'delta')]


# -- names the registry is keyed by ---------------------------------------------------
class _InheritsPVT(PolaPVT):
    """A user's PolaPVT subclass that keeps the family name it inherits ('pvt')."""


class _OwnName(PolaPVT):
    """The same, with a family name of its own."""
    family = 'own_pvt_of_test_backbone_family'


def test_a_taken_family_name_is_refused_and_the_advice_registers():
    """A subclass registered under the name it inherits ('pvt') would replace the built-in
    family (PolaPVT then had none, and the warm start refused it): refused, naming the
    owner; a family name of its own, as the error says, registers beside it."""
    pvt = family_of(PolaPVT)
    with pytest.raises(
            ValueError,
            match=r"the family name 'pvt' is taken by polaformer_mm\.models\.backbones\."
            r"pola_pvt\.PolaPVT \(PVT v1\); _InheritsPVT\.family is 'pvt' \(inherited from "
            r"its parent class\)\. Give _InheritsPVT a family name of its own"):
        register_family(BackboneFamily(name='pvt', title='Mine', backbone=_InheritsPVT))
    assert family_of(PolaPVT) is pvt and family_of(_InheritsPVT) is pvt
    own = register_family(
        BackboneFamily(name=_OwnName.family, title='Own', backbone=_OwnName, config_name='own'))
    try:
        assert family_of(_OwnName) is own and family_of(PolaPVT) is pvt
        # the same class registered again (a reloaded module) replaces its entry
        assert register_family(dataclasses.replace(own, title='Own 2')).title == 'Own 2'
    finally:
        unregister_family(_OwnName.family)


@pytest.mark.parametrize('field, value, match', [
    ('config_name', 'pvt', r"config_name 'pvt' is that of the family 'pvt'"),
    ('reproduce', {
        'semantic-fpn': {
            'pvt-t': 'x.py'
        }
    }, r"--arch pvt-t of task 'semantic-fpn' \(family 'pvt'\) already taken"),
])
def test_names_another_family_has_are_refused(field, value, match):
    family = BackboneFamily(**dict(
        dict(name=_OwnName.family, title='Own', backbone=_OwnName, config_name='own'), **
        {field: value}))
    with pytest.raises(ValueError, match=match):
        register_family(family)
    assert _OwnName.family not in {f.name for f in families()}


def test_benchmark_names_two_families_give_are_named(toy_family):
    from polaformer_mm.analysis.benchmark import BenchmarkError, named_backbones
    unregister_family('toy')
    try:
        register_family(
            dataclasses.replace(
                TOY, benchmark=lambda: dict(_toy_benchmark(), **{'pola-pvt-t': dict()})))
        with pytest.raises(
                BenchmarkError, match=r"'pola-pvt-t' is named by the families 'pvt' and 'toy'"):
            named_backbones()
    finally:
        unregister_family('toy')
        register_family(TOY)
    assert 'pola-toy-n' in named_backbones()


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(backbone='PolaPVT'), TypeError,
     r"backbone='PolaPVT'\): backbone takes the Pola backbone class itself, not its name"),
    (dict(backbone=PolaToy, name=''), TypeError, r"name takes a non-empty str"),
    (dict(backbone=PolaToy,
          attention_names='layers.(?P<stage>'), ValueError, r'not a regular expression'),
    (dict(backbone=PolaToy, attention_names=r'layers\.(?P<stage>\d+)'), ValueError,
     r'needs a group \(\?P<block>\.\.\.\)'),
])
def test_family_fields_are_checked_when_declared(kwargs, error, match):
    """``BackboneFamily(backbone='PolaPVT')`` was an AttributeError ('str' object has no
    attribute '__name__') at registration."""
    kwargs = dict(dict(name='toy', title='Toy'), **kwargs)
    with pytest.raises(error, match=match):
        BackboneFamily(**kwargs)
    # as the message says: the class itself
    assert BackboneFamily(name='toy', title='Toy', backbone=PolaToy).backbone is PolaToy


def test_visualize_attention_names_a_family_without_attention_names(toy_family, tmp_path):
    """The toy family without ``attention_names``: one line naming the family and the field
    (the tool's command-line runner, no traceback), and with the field declared it draws."""
    from polaformer_mm.engine.entry import run_tool
    tool = load_tool('analysis_tools/visualize_attention.py', '_visualize_attention_toy2')
    config = _config(tmp_path, 'fpn_pola-toy-n_synthetic-seg', 'LSSS')
    argv = [config, IMAGE, '--out-dir', str(tmp_path / 'out'), '--num-queries', '4']
    unregister_family('toy')
    try:
        register_family(dataclasses.replace(TOY, attention_names=None))
        with warnings.catch_warnings(), pytest.raises(SystemExit) as info:
            warnings.simplefilter('ignore')  # the random-weights warning
            run_tool(lambda: tool.main(argv), 'visualize_attention.py')
    finally:
        unregister_family('toy')
        register_family(TOY)
    message = str(info.value.code)
    assert message.startswith(
        "visualize_attention.py: error: layers.0.blocks.0.attn: the PolaToy backbone belongs "
        "to the family 'toy', which declares no attention_names; the attention analysis "
        'finds Pola attention modules by BackboneFamily.attention_names'), message
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        written = tool.main(argv)
    assert len(written['blocks']) == 1
