"""tools/analysis_tools/visualize_attention.py and polaformer_mm.analysis (attention sites,
maps) on a real photograph (matplotlib's sample image): the quickstart Pola-PVT-T detector
with the PVT-T baseline config, and a tiny windowed Pola-Swin detector with a tiny Swin
baseline; the weights it draws are checked against what the modules computed."""
import json
import math
import os.path as osp
import warnings

import matplotlib
import mmcv
import numpy as np
import pytest
import torch

from polaformer_mm.analysis.attention_sites import (collect_pola_sites, collect_softmax_sites,
                                                    grid_stride)
from polaformer_mm.analysis.loading import build_model, load_weights, prepare_image
from polaformer_mm.engine.entry import load_config
from polaformer_mm.models.window_geometry import window_reverse
from polaformer_mm.ops import pola_linear_attention
from tests import REPO
from .._tools import load_tool

IMAGE = osp.join(matplotlib.get_data_path(), 'sample_data', 'grace_hopper.jpg')
PVT_CONFIG = osp.join(REPO, 'configs', 'quickstart', 'mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
PVT_BASELINE = osp.join(REPO, 'configs', 'pola_pvt', 'mask-rcnn_pvt-t_fpn_1x_coco.py')
SEG_CONFIG = osp.join(REPO, 'configs', 'quickstart', 'fpn_pola-pvt-nano_synthetic-seg.py')
SEG_BASELINE = osp.join(REPO, 'configs', 'pola_pvt', 'fpn_pvt-t_8xb2-40k_ade20k-512x512.py')

# Pola-Swin with 'L' windows of 6 tokens: at 150 x 128 (padded to 160 x 128) stage 0 is
# 40 x 32 tokens, stage 1 20 x 16, so both pad to whole windows and odd blocks shift.
POLA_SWIN = """
_base_ = '{root}/configs/pola_swin/mask-rcnn_pola-swin-t-p4-w7_fpn_ms-crop-1x_coco.py'
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=16, depths=[2, 2, 2, 2],
                            num_heads=[1, 2, 2, 4]),
                  linear_window_size=6, drop_path_rate=0., init_cfg=None),
    neck=dict(in_channels=[16, 32, 64, 128]))
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(150, 150), keep_ratio=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
"""
SWIN = """
_base_ = '{root}/configs/pola_swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-1x_coco.py'
model = dict(
    backbone=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4],
                  drop_path_rate=0., init_cfg=None),
    neck=dict(in_channels=[16, 32, 64, 128]))
"""

tool = load_tool('analysis_tools/visualize_attention.py')


@pytest.fixture(scope='module')
def swin_configs(tmp_path_factory):
    folder = tmp_path_factory.mktemp('configs')
    paths = {}
    for name, text in (('pola', POLA_SWIN), ('swin', SWIN)):
        paths[name] = str(folder / f'{name}_tiny.py')
        with open(paths[name], 'w') as f:
            f.write(text.format(root=REPO))
    return paths


def _run(argv):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        written = tool.main(argv)
    with open(written['json']) as f:
        summary = json.load(f)
    return written, summary, [str(w.message) for w in caught]


def _check_summary(written, summary, num_points):
    """Files exist; every number is in its range."""
    for path in written['blocks'] + [written['entropy'], written['exponents']]:
        assert mmcv.imread(path).ndim == 3
    assert {
        'config', 'checkpoint', 'random_weights', 'image', 'image_shape', 'input_shape', 'points',
        'blocks', 'stages'
    } <= set(summary)
    assert summary['image_shape'] == [600, 512]
    assert len(summary['points']) == num_points
    assert [osp.basename(p) for p in written['blocks']] == [b['figure'] for b in summary['blocks']]
    for block in summary['blocks']:
        h = block['num_heads']
        entropy = block['entropy']
        assert entropy['num_queries'] > 0
        log_n = entropy['log_n']
        for stream in ('same_signed', 'opposite_signed'):
            for variant in ('learned', 'p1'):
                values = entropy[stream][variant]
                assert len(values) == h
                assert all(0 <= v <= log_n + 1e-9 for v in values), (block['name'], values)
        p = np.array(block['exponents']['per_head'])
        assert p.shape == (h, block['head_dims'])
        alpha = next(s['alpha'] for s in summary['stages'] if s['stage'] == block['stage'])
        assert ((p > 1) & (p < 1 + alpha)).all()
        assert len(block['points']) == num_points
        for point in block['points']:
            for stream in ('same_signed', 'opposite_signed'):
                assert all(0 < w <= 1 for w in point[stream]['max_weight'])
                assert point[stream]['off_map_weight'] == [0.] * h  # padding: no weight
        if 'baseline' in block:
            base = block['baseline']
            assert all(0 <= v <= base['entropy']['log_n'] + 1e-6
                       for v in base['entropy']['softmax'])
    for stage in summary['stages']:
        assert sum(stage['histogram']['counts']) == stage['count']
        assert 1 < stage['min'] <= stage['mean'] <= stage['max'] < 1 + stage['alpha']


def test_quickstart_pvt_with_baseline_random_weights(tmp_path):
    written, summary, messages = _run([
        PVT_CONFIG, IMAGE, '--out-dir',
        str(tmp_path), '--device', 'cpu', '--baseline-config', PVT_BASELINE, '--dpi', '40'
    ])
    assert any('RANDOM' in m and '--checkpoint' in m for m in messages)
    assert any('RANDOM' in m and '--baseline-checkpoint' in m for m in messages)
    assert summary['random_weights'] and summary['baseline_random_weights']
    _check_summary(written, summary, num_points=3)
    blocks = summary['blocks']
    # arch 'nano': one block per stage
    assert [(b['stage'], b['block']) for b in blocks] == [(s, 0) for s in range(4)]
    first = blocks[0]
    # the 64 x 55 input, padded to 64 x 64: a 16 x 16 stage-0 grid
    assert first['layout'] == 'global' and first['query_grid'] == [16, 16]
    assert first['stride'] == 4 and first['key_grid'] == [16, 16]
    assert first['entropy']['log_n'] == pytest.approx(math.log(16 * 16))
    # the PVT-T baseline reduces stage-0 keys 8x: 2 x 2 keys of 32 pixels
    assert first['baseline']['key_grid'] == [2, 2]
    assert first['baseline']['key_cell_pixels'] == 32
    # random initialisation: power = 0, so every exponent is 1 + alpha / 2
    assert all(s['min'] == s['max'] == pytest.approx(3.) for s in summary['stages'])
    # default points: the centre of the 512 x 600 image, mapped into the 55 x 64 input
    assert summary['points'][0]['image_xy'] == [256., 300.]
    x, y = summary['points'][0]['input_xy']
    assert x == pytest.approx(256.5 * 55 / 512 - 0.5) and y == pytest.approx(300.5 * 64 / 600 - 0.5)


def test_windowed_pola_swin_with_swin_baseline_and_checkpoint(tmp_path, swin_configs):
    """Learned exponents come from the checkpoint; windows, shifts and padding are
    reported; the baseline's entropy is there."""
    cfg = load_config(swin_configs['pola'])
    model = build_model(cfg, None, 'cpu', seed=1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith('attn.power'):
                param.normal_(0, 2)
    ckpt = tmp_path / 'model.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, ckpt)
    written, summary, messages = _run([
        swin_configs['pola'], IMAGE, '--out-dir',
        str(tmp_path / 'out'), '--device', 'cpu', '--checkpoint',
        str(ckpt), '--baseline-config', swin_configs['swin'], '--points', '100,120', '500,590',
        '--per-head', '--dpi', '40'
    ])
    assert not any('--checkpoint CKPT' in m for m in messages)
    assert any('--baseline-checkpoint' in m for m in messages)
    assert not summary['random_weights'] and summary['baseline_random_weights']
    _check_summary(written, summary, num_points=2)
    blocks = {(b['stage'], b['block']): b for b in summary['blocks']}
    assert sorted(blocks) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # 'LLSS'
    state = model.state_dict()
    for (stage, block), info in blocks.items():
        power = state[f'backbone.stages.{stage}.blocks.{block}.attn.power'][0, :, 0]
        np.testing.assert_allclose(info['exponents']['per_head'],
                                   (1 + 4 * torch.sigmoid(power.double())).numpy())
        assert info['layout'] == 'window' and info['window_size'] == 6
        assert info['shift'] == (3 if block == 1 else 0)
        assert info['baseline']['window_size'] == 7
        assert info['baseline']['shift'] == (3 if block == 1 else 0)
        assert info['entropy']['log_n'] <= math.log(36) + 1e-12
    assert blocks[(0, 0)]['query_grid'] == [40, 32]
    assert blocks[(1, 0)]['query_grid'] == [20, 16]
    # the learned exponents differ from 1 + alpha / 2 and vary over channels
    assert summary['stages'][0]['max'] - summary['stages'][0]['min'] > 1


def _assert_rows_give_the_output(site, out_map, v_map):
    """Every token's drawn weights of both streams times the values (H, W, h, d) on the
    stage map give the op's output there (H, W, h, d); returns the maps."""
    H, W = site.stage_hw
    cells = np.stack(np.meshgrid(np.arange(H), np.arange(W), indexing='ij'), -1).reshape(-1, 2)
    maps = site.maps(cells)
    d1 = (v_map.shape[-1] + 1) // 2
    for stream, part in (('same_signed', slice(0, d1)), ('opposite_signed', slice(d1, None))):
        weights = torch.from_numpy(maps[stream])  # (m, h, H, W)
        pred = torch.einsum('mhij,ijhc->mhc', weights, v_map[..., part])
        expected = out_map[cells[:, 0], cells[:, 1]][..., part]
        torch.testing.assert_close(pred, expected, rtol=1e-9, atol=1e-9)
    return maps


def test_windowed_weights_reproduce_the_module_outputs(swin_configs):
    """For every token of every 'L' block, the drawn weights times the values (laid
    out on the stage map) give the op's output at that token, so the window,
    shift and padding bookkeeping is the model's. Same for the Swin baseline's softmax
    windows, against its ``w_msa`` output."""
    cfg = load_config(swin_configs['pola'])
    model = build_model(cfg, None, 'cpu', seed=0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(('attn.power', 'positional_encoding')):
                param.normal_()
    prepared = prepare_image(cfg, model, IMAGE)
    sites = collect_pola_sites(model.backbone, prepared.inputs)
    assert [s.window for s in sites] == [(6, 0), (6, 3), (6, 0), (6, 3)]
    for site in sites:
        args, kwargs = site.call
        q, k, v, _, eps, _ = site.attn.project(*args, **kwargs)
        q, k, v = q.double(), k.double(), v.double()
        eps = eps.double() if torch.is_tensor(eps) else eps
        out = pola_linear_attention(q, k, v, site.attn.power.double(), site.alpha, eps)
        H, W = site.stage_hw
        ws, shift = site.window
        Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws
        assert (Hp, Wp) != (H, W)  # padded windows are part of the check

        def to_map(t):  # (nW, h, T, d) windows -> (H, W, h, d), as the block does
            nW, h, T, d = t.shape
            x = window_reverse(t.permute(0, 2, 1, 3).reshape(nW, T, h * d), ws, Hp, Wp)
            x = torch.roll(x, (shift, shift), dims=(1, 2))
            return x[0, :H, :W].reshape(H, W, h, d)

        maps = _assert_rows_give_the_output(site, to_map(out), to_map(v))
        assert all(
            (maps[f'{stream}_off_map'] == 0).all() for stream in ('same_signed', 'opposite_signed'))
        assert maps['keys'].sum(axis=(1, 2)).max() == ws * ws

    base_cfg = load_config(swin_configs['swin'])
    base = build_model(base_cfg, None, 'cpu', seed=0)
    seen = {}
    for name, module in base.backbone.named_modules():
        if hasattr(module, 'w_msa') and hasattr(module, 'shift_size'):
            msa = module.w_msa
            msa.register_forward_pre_hook(lambda m, a, key=name: seen.__setitem__(key + '/x', a[0]))
            msa.proj.register_forward_pre_hook(
                lambda m, a, key=name: seen.__setitem__(key + '/out', a[0]))
    base_sites = collect_softmax_sites(base.backbone, prepared.inputs)
    assert [(s.stage, s.block) for s in base_sites] == [(i, j) for i in range(4) for j in range(2)]
    for site in base_sites[:4]:
        msa = site.module.w_msa
        C = seen[site.name + '/x'].shape[-1]
        h = site.num_heads
        H, W = site.stage_hw
        ws, shift = site.window
        Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws

        def to_map(t):  # (nW, T, C) -> (H, W, h, C / h), as ShiftWindowMSA does
            x = site.module.window_reverse(t.view(-1, ws, ws, C), Hp, Wp)
            x = torch.roll(x, (shift, shift), dims=(1, 2)) if shift else x
            return x[0, :H, :W].reshape(H, W, h, C // h).double()

        with torch.no_grad():
            v = msa.qkv(seen[site.name + '/x'])[..., 2 * C:]
            v_pad = msa.qkv.bias[2 * C:].reshape(h, C // h).double()  # padded: x = 0
        v_map, out_map = to_map(v), to_map(seen[site.name + '/out'])
        cells = np.array([[0, 0], [H - 1, W - 1], [H // 2, W // 3], [H - 2, 1]])
        maps = site.maps(cells)
        weights = torch.from_numpy(maps['softmax'])
        pred = torch.einsum('mhij,ijhc->mhc', weights, v_map)
        pred = pred + torch.from_numpy(maps['softmax_off_map'])[..., None] * v_pad
        expected = out_map[cells[:, 0], cells[:, 1]]
        torch.testing.assert_close(pred, expected, rtol=1e-4, atol=1e-5)


def test_spatial_reduction_weights_reproduce_the_baseline_output():
    """PVT baseline of a segmentation config on the whole 512 x 600 photograph
    (spatially reduced keys; mmdet's PVT drops the remainder of odd grids where Pola-PVT
    pads): weights times values, through the output projection, give
    nn.MultiheadAttention's output at the query token."""
    cfg = load_config(SEG_CONFIG)
    model = build_model(cfg, None, 'cpu', seed=0)
    prepared = prepare_image(cfg, model, IMAGE)
    assert tuple(prepared.inputs.shape[-2:]) == (600, 512)
    pola_sites = collect_pola_sites(model.backbone, prepared.inputs)
    base = build_model(load_config(SEG_BASELINE), None, 'cpu', seed=0)
    outputs = {}

    def keep_first_output(key):  # the backbone's call, not the tool's later ones

        def hook(module, args, out):
            outputs.setdefault(key, out[0])

        return hook

    for name, module in base.backbone.named_modules():
        if isinstance(module, torch.nn.MultiheadAttention):
            module.register_forward_hook(keep_first_output(name))
    sites = collect_softmax_sites(base.backbone, prepared.inputs)
    # Pola-PVT-nano: one block per stage; the PVT-T baseline: two
    assert [s.stage_hw for s in pola_sites] == [(150, 128), (75, 64), (38, 32), (19, 16)]
    assert [s.stage_hw for s in sites[::2]] == [(150, 128), (75, 64), (37, 32), (18, 16)]
    assert [s.stride for s in pola_sites] == [4, 8, 16, 32]
    assert [s.stride for s in sites] == [4, 4, 8, 8, 16, 16, 32, 32]
    assert [s.key_hw for s in sites[::2]] == [(18, 16), (18, 16), (18, 16), (18, 16)]
    assert [s.key_cell for s in sites[::2]] == [32, 32, 32, 32]
    for site in sites[::3]:
        mha = site.mha
        H, W = site.stage_hw
        C, h = mha.embed_dim, mha.num_heads
        cells = np.array([[0, 0], [H - 1, W - 1], [H // 2, W // 3]])
        weights = torch.from_numpy(site.maps(cells)['softmax']).float()
        with torch.no_grad():
            w_v, b_v = mha.in_proj_weight[2 * C:], mha.in_proj_bias[2 * C:]
            v = (site.value[:, 0] @ w_v.T + b_v).reshape(*site.key_hw, h, C // h)
            mixed = torch.einsum('mhij,ijhc->mhc', weights, v).reshape(len(cells), C)
            pred = mha.out_proj(mixed)
        expected = outputs[site.name + '.attn'][cells[:, 0] * W + cells[:, 1], 0]
        torch.testing.assert_close(pred, expected, rtol=1e-4, atol=1e-5)


def test_grid_stride():
    assert grid_stride((600, 512), (150, 128)) == 4
    assert grid_stride((600, 512), (38, 32)) == 16  # ceil
    assert grid_stride((600, 512), (37, 32)) == 16  # floor
    assert grid_stride((160, 128), (40, 32)) == 4


def test_bad_input_is_named(tmp_path, swin_configs):
    with pytest.raises(ValueError, match='outside the image'):
        tool.main([PVT_CONFIG, IMAGE, '--out-dir', str(tmp_path), '--points', '600,10'])
    with pytest.raises(ValueError, match='x,y'):
        tool.main([PVT_CONFIG, IMAGE, '--out-dir', str(tmp_path), '--points', '600'])
    with pytest.raises(FileNotFoundError, match='missing.pth'):
        tool.main([
            PVT_CONFIG, IMAGE, '--out-dir',
            str(tmp_path), '--checkpoint',
            str(tmp_path / 'missing.pth')
        ])
    # a checkpoint without the backbone's attention weights
    cfg = load_config(swin_configs['pola'])
    model = build_model(cfg, None, 'cpu', seed=0)
    state = {k: v for k, v in model.state_dict().items() if 'attn.power' not in k}
    torch.save({'state_dict': state}, tmp_path / 'partial.pth')
    with pytest.raises(KeyError, match='attn.power'):
        load_weights(model, str(tmp_path / 'partial.pth'))
    with pytest.warns(UserWarning, match='RANDOM'), pytest.raises(ValueError, match='no Pola'):
        tool.main([swin_configs['swin'], IMAGE, '--out-dir', str(tmp_path)])


PVTV2 = """
_base_ = '{root}/configs/pola_pvtv2/mask-rcnn_pola-pvtv2-b0_fpn_1x_coco.py'
model = dict(backbone=dict(init_cfg=None))
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(150, 150), keep_ratio=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
"""
VIT = """
_base_ = '{root}/configs/pola_vit/upernet_pola-deit-s16_8xb2-160k_ade20k-512x512.py'
model = dict(backbone=dict(arch=dict(_delete_=True, embed_dims=32, num_layers=4, num_heads=2,
                                     feedforward_channels=64),
                           out_indices=(1, 3), attn_types='LSLL', init_cfg=None))
"""


@pytest.mark.slow
@pytest.mark.parametrize('family,text,blocks', [('PolaPVTv2', PVTV2, 8), ('PolaViT', VIT, 3)])
def test_tool_on_pvtv2_and_vit(family, text, blocks, tmp_path):
    """PolaPVTv2 (mmdet's layers.<i>.1.<j> layout) and PolaViT (a class token, blocks
    layers.<j>): the tool draws every 'L' block, and the weights it draws, applied to the
    module's values, give what the Pola op computed (the class key included for PolaViT)."""
    config = tmp_path / 'cfg.py'
    config.write_text(text.format(root=REPO))
    out = tmp_path / 'out'
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        report = tool.main([str(config), IMAGE, '--out-dir', str(out)])
    assert len(report['blocks']) == blocks
    info = json.loads((out / 'attention.json').read_text())
    assert len(info['blocks']) == blocks, list(info)
    assert len([p for p in out.iterdir() if p.name.startswith('attention_s')]) == blocks
    cfg = load_config(str(config))
    model = build_model(cfg, None, 'cpu', 0)
    prepared = prepare_image(cfg, model, IMAGE)
    sites = collect_pola_sites(model.backbone, prepared.inputs)
    assert len(sites) == blocks
    site = sites[-1]
    h, w = site.stage_hw
    cells = np.array([[0, 0], [h - 1, w - 1], [h // 2, w // 2]])
    maps = site.maps(cells)
    for stream in ('same_signed', 'opposite_signed'):
        total = maps[stream].sum((-2, -1)) + maps[f'{stream}_off_map']
        # each stream's row sums to 1 less what the op's eps takes (at random weights
        # PolaViT's queries and keys are small: up to a few percent)
        assert ((total <= 1 + 1e-9) & (total > (0.95 if family == 'PolaViT' else 0.9999))).all()
        if family == 'PolaViT':  # the class key's weight
            assert (maps[f'{stream}_off_map'] > 0).all()
        else:
            assert (maps[f'{stream}_off_map'] == 0).all()
