"""Every config under configs/ (except ``_base_`` fragments) parses, names polaformer_mm
in its own ``custom_imports`` and builds in its default scope. Pola configs also take
their weights from ``checkpoints/pola_*_mm.pth``, feed their necks / heads the channels
the backbone really produces (checked by a 64x64 forward), and differ from their softmax
baseline in the backbone only.

Each model is built once (``test_builds_and_channels_match``; configs with identical
model dicts share one build); only parsed configs and check results are cached, so
memory holds one model at a time.
"""
import ast
import glob
import importlib
import json
import os.path as osp
import re

import pytest
import torch
from mmengine.registry import DefaultScope

from polaformer_mm.analysis.flops import measure_configs
from polaformer_mm.engine.model_check import check_model_channels
from tests import REPO
from tests._configs import load_config, zero_initialised

CONFIG_DIR = osp.join(REPO, 'configs')
POLA_TYPES = ('PolaPVT', 'PolaSwin', 'PolaPVTv2', 'PolaViT')
# backbone type -> the family in checkpoints/pola_<family>_<size>_mm.pth
CHECKPOINT_FAMILIES = {
    'PolaPVT': 'pvt',
    'PolaSwin': 'swin',
    'PolaPVTv2': 'pvtv2',
    'PolaViT': 'deit'
}
# someone else's folder: only the house rules (parse, imports, header, build) apply there
RULES_ONLY = ('quickstart', )


def _config_files():
    files = []
    for path in glob.glob(osp.join(CONFIG_DIR, '**', '*.py'), recursive=True):
        rel = osp.relpath(path, CONFIG_DIR)
        if '_base_' in rel.split(osp.sep)[:-1] or rel.startswith('_base_'):
            continue
        files.append(osp.relpath(path, REPO))
    return sorted(files)


CONFIGS = _config_files()

_load = load_config  # Config.fromfile also imports the config's custom_imports


def _registry(scope):
    return importlib.import_module(f'{scope}.registry').MODELS


def _is_pola(cfg):
    return cfg.model.get('backbone', {}).get('type') in POLA_TYPES


def _expected_checkpoint(backbone):
    kind = CHECKPOINT_FAMILIES[backbone['type']]
    arch = backbone.get('arch', 'tiny')
    assert isinstance(arch, str), 'configs should name a standard arch'
    # PVTv2 sizes keep their name (b0..b5); the others their initial ('deit-small': 's')
    size = arch.lower() if kind == 'pvtv2' else arch.split('-')[-1][0].lower()
    return f'checkpoints/pola_{kind}_{size}_mm.pth'


def _in_rules_only_folder(path):
    return osp.relpath(osp.join(REPO, path), CONFIG_DIR).split(osp.sep)[0] in RULES_ONLY


def test_found_configs():
    assert len(CONFIGS) >= 50, CONFIGS
    for folder in ('pola_pvt', 'pola_swin', 'pola_pvtv2', 'pola_vit', 'imagenet'):
        assert any(p.startswith(f'configs/{folder}/') for p in CONFIGS), folder


@pytest.mark.parametrize('path', CONFIGS)
def test_house_rules(path):
    with open(osp.join(REPO, path)) as f:
        text = f.read()
    assert text.startswith('#'), 'a header comment names the protocol it follows'
    # custom_imports in the file itself, not only inherited
    own = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == 'custom_imports' for t in node.targets):
            own = eval(compile(ast.Expression(node.value), path, 'eval'), {'dict': dict})
    assert 'polaformer_mm' in own.get('imports', []), 'custom_imports names polaformer_mm'
    assert own.get('allow_failed_imports') is False
    cfg = _load(path)
    assert cfg.get('default_scope') in ('mmdet', 'mmseg', 'mmpretrain')
    assert 'polaformer_mm' in cfg.custom_imports['imports']


@pytest.mark.parametrize('path', CONFIGS)
def test_pola_weights_under_checkpoints(path):
    cfg = _load(path)
    if not _is_pola(cfg) or _in_rules_only_folder(path):
        pytest.skip('not a Pola config of ours')
    backbone = cfg.model.backbone
    expected = _expected_checkpoint(backbone)
    init_cfg = backbone.get('init_cfg')
    assert backbone.get('pretrained') is None and cfg.model.get('pretrained') is None
    if cfg.default_scope in ('mmdet', 'mmseg'):
        assert init_cfg == dict(type='Pretrained', checkpoint=expected)
    else:
        # ImageNet: from scratch (evaluate with tools/test.py CONFIG CKPT), or a
        # fine-tuning run whose backbone loads the backbone.* keys of the file that
        # official2mm.py or softmax2pola.py writes
        assert cfg.get('load_from') is None
        if '_ft-' in osp.basename(path):
            assert init_cfg == dict(type='Pretrained', checkpoint=expected, prefix='backbone.')
        else:
            assert init_cfg is None


def _baseline_of(path):
    name = osp.basename(path)
    if 'pola-' not in name:
        return None
    base = osp.join(osp.dirname(path), name.replace('pola-', '', 1))
    return base if osp.exists(osp.join(REPO, base)) else None


PAIRS = [(p, _baseline_of(p)) for p in CONFIGS if _baseline_of(p)]
DENSE_KINDS = ('mask-rcnn', 'retinanet', 'fpn', 'upernet', 'cascade-mask-rcnn', 'mask2former')


def test_every_dense_pola_config_has_a_baseline():
    paired = {p for p, _ in PAIRS}
    for path in CONFIGS:
        if (osp.basename(path).split('_')[0] in DENSE_KINDS and 'pola-' in path
                and not _in_rules_only_folder(path)):
            assert path in paired, f'{path} has no softmax baseline next to it'


@pytest.mark.parametrize('pola,baseline', PAIRS, ids=[p for p, _ in PAIRS])
def test_pola_differs_from_baseline_in_backbone_only(pola, baseline):
    a, b = _load(pola).to_dict(), _load(baseline).to_dict()
    for cfg in (a, b):
        cfg.pop('custom_imports')
        cfg['model'].pop('backbone')
        cfg['model'].pop('pretrained', None)
    assert a == b


def _pixel_decoder_channels(decoder):
    """The channels mmdet's MSDeformAttnPixelDecoder takes per level, high resolution first:
    its 1x1 lateral convs (the levels outside the encoder) and input convs (the encoder's
    levels), each list built from low to high resolution."""
    convs = list(decoder.lateral_convs)[::-1] + list(decoder.input_convs)[::-1]
    return [c.conv.in_channels for c in convs]


def _check_channels(model, channels):
    """Necks / heads that read backbone maps take the channels the backbone gives."""
    neck = getattr(model, 'neck', None)
    if neck is not None and hasattr(neck, 'in_channels'):
        assert list(neck.in_channels) == channels
        return 'neck'
    # Mask2Former (mmdet's panoptic_head, mmseg's decode_head): every map, no in_index
    for name in ('panoptic_head', 'decode_head'):
        head = getattr(model, name, None)
        if head is not None and not hasattr(head, 'in_index') and hasattr(head, 'pixel_decoder'):
            assert _pixel_decoder_channels(head.pixel_decoder) == channels, name
            return name
    for name in ('decode_head', 'auxiliary_head'):  # mmseg without a neck (UperNet)
        head = getattr(model, name, None)
        if head is None:
            continue
        if isinstance(head, torch.nn.ModuleList):
            heads = list(head)
        else:
            heads = [head]
        for h in heads:
            idx = h.in_index
            want = [channels[i] for i in idx] if isinstance(idx, (list, tuple)) else channels[idx]
            got = list(h.in_channels) if isinstance(h.in_channels, (list, tuple)) \
                else h.in_channels
            assert got == want, f'{name}: {got} != {want}'
    if hasattr(model, 'decode_head'):
        return 'decode_head'
    head = getattr(model, 'head', None)  # mmpretrain classifier after global pooling
    assert head is not None and head.in_channels == channels[-1]
    return 'head'


# Configs whose model dicts are identical (Mask R-CNN 1x / 3x, ImageNet from-scratch /
# fine-tuning) build the same model: build it once, keep only what the checks found.
_BUILT = {}


def _build_and_check(cfg):
    key = (cfg.default_scope, json.dumps(cfg.model.to_dict(), sort_keys=True, default=repr))
    if key not in _BUILT:
        registry = _registry(cfg.default_scope)
        # the checks read the structure, not the values: zeros for torch's random draws
        with DefaultScope.overwrite_default_scope(cfg.default_scope), zero_initialised():
            model = registry.build(cfg.model)
        model.eval()
        with torch.no_grad():
            outs = model.backbone(torch.zeros(1, 3, 64, 64))
        # a ViT with output_cls_token returns [patch map, class token] per output
        channels = [(o[0] if isinstance(o, (list, tuple)) else o).shape[1] for o in outs]
        if _is_pola(cfg):
            assert channels == [model.backbone.num_features[i] for i in model.backbone.out_indices]
            assert channels == model.backbone.out_channels
            check_model_channels(model)  # the build-time check passes every released config
        if _is_pola(cfg):
            _check_weight_decay(cfg, model)
        _BUILT[key] = (channels, _check_channels(model, channels))
    return _BUILT[key]


def _check_weight_decay(cfg, model):
    """The protocol decisions on weight decay, as the optimizer really applies them.

    Swin dense protocol: no decay for norms, relative position tables and the Pola
    positional encoding; PVT dense protocol: decay on everything (no paramwise rules);
    ImageNet (official recipe): no decay for 1-D parameters, norms and relative position
    tables, decay on the positional encoding. Pola 'power' and 'scale' always decay.
    """
    from mmengine.optim import build_optim_wrapper
    wrapper_cfg = cfg.optim_wrapper.copy()
    if wrapper_cfg.get('type') == 'AmpOptimWrapper':  # needs CUDA; decay rules are the same
        wrapper_cfg['type'] = 'OptimWrapper'
        for key in ('loss_scale', 'dtype', 'use_fsdp'):
            wrapper_cfg.pop(key, None)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        optim_wrapper = build_optim_wrapper(model, wrapper_cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {}
    for group in optim_wrapper.optimizer.param_groups:
        for param in group['params']:
            decay[names[id(param)]] = group['weight_decay']
    base = cfg.optim_wrapper.optimizer.weight_decay
    paramwise = 'paramwise_cfg' in cfg.optim_wrapper
    # mmpretrain's recipes: no decay for any 1-D parameter (PVTv2's stage norms layers.i.2,
    # the ViT's LayerNorms ln1 / ln2 are norms without 'norm' in their names)
    flat = paramwise and cfg.optim_wrapper.paramwise_cfg.get('flat_decay_mult') == 0
    vit = cfg.model.backbone.type == 'PolaViT'
    shapes = {n: p.shape for n, p in model.backbone.named_parameters()}
    backbone = {n[len('backbone.'):]: d for n, d in decay.items() if n.startswith('backbone.')}
    assert backbone
    for name, value in backbone.items():
        leaf = name.split('.')[-1]
        owner = name.split('.')[-2] if '.' in name else ''
        if leaf in ('power', 'scale') or not paramwise:
            want = base
        elif leaf == 'relative_position_bias_table' or 'norm' in owner:
            want = 0.
        elif flat and len(shapes[name]) == 1:
            want = 0.
        elif vit and leaf in ('cls_token', 'pos_embed'):  # mmseg's / mmpretrain's ViT rules
            want = 0.
        elif leaf == 'positional_encoding':
            want = base if cfg.default_scope == 'mmpretrain' else 0.
        elif leaf == 'bias':
            want = 0. if cfg.default_scope == 'mmpretrain' else base
        else:
            want = base
        assert value == want, f'{name}: weight decay {value}, expected {want}'


@pytest.mark.parametrize('path', CONFIGS)
def test_builds_and_channels_match(path):
    channels, checked = _build_and_check(_load(path))
    assert channels and checked


def test_checkpoint_names_follow_converter():
    """The paths the configs use are those docs/user_guides/official_weights.md tells
    official2mm.py to write."""
    names = set()
    for path in CONFIGS:
        with open(osp.join(REPO, path)) as f:
            names.update(re.findall(r'checkpoints/pola_\w+?_mm\.pth', f.read()))
    official = {f'checkpoints/pola_pvt_{s}_mm.pth' for s in 'tsml'}
    official |= {f'checkpoints/pola_swin_{s}_mm.pth' for s in 'tsb'}
    assert official <= names
    # families without official weights: files of the warm-start converter (or ImageNet runs)
    warm = {f'checkpoints/pola_pvtv2_b{i}_mm.pth' for i in range(6)}
    warm |= {f'checkpoints/pola_deit_{s}_mm.pth' for s in 'tsb'}
    assert names - official == warm


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
@pytest.mark.parametrize('path,options', [
    ('configs/pola_pvt/mask-rcnn_pola-pvt-t_fpn_1x_coco.py', None),
    ('configs/pola_pvt/mask-rcnn_pola-pvt-t_fpn_1x_coco.py', {
        'model.backbone.attn_types': 'LLSS',
        'model.backbone.la_sr_ratios': [8, 4, 2, 1]
    }),
    ('configs/pola_swin/upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py', None),
    ('configs/pola_pvtv2/retinanet_pola-pvtv2-b0_fpn_1x_coco.py', {
        'model.backbone.attn_types': 'LLSS'
    }),
    ('configs/pola_vit/upernet_pola-deit-s16_8xb2-80k_ade20k-512x512.py', None),
])
def test_get_flops_counts_the_attention(path, options, flop_table):
    """tools/analysis_tools/get_flops.py (polaformer_mm.analysis.flops) counts every
    non-elementwise operator of the Pola backbones, the attention products included
    (matmul; SDPA in 'S' PVT stages)."""
    (row, ) = measure_configs([osp.join(REPO, path)], (64, 96), False, options)
    assert row['uncounted'] == [] and row['shape'] == '64x96'
    cfg = _load(path).copy()
    if options:
        cfg.merge_from_dict(options)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        backbone = _registry(cfg.default_scope).build(cfg.model.backbone)
    backbone.eval()
    assert row['params'] == sum(p.numel() for p in backbone.parameters())
    from mmengine.analysis import FlopAnalyzer
    analyzer = FlopAnalyzer(backbone, (torch.randn(1, 3, 64, 96), ))
    analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    attention = ('aten::matmul', 'aten::scaled_dot_product_attention')
    analyzer.set_op_handle(**{op: (lambda inputs, outputs: 0) for op in attention})
    assert row['flops'] > analyzer.total() > 0


@pytest.mark.parametrize('path,shape,group', [
    ('configs/pola_pvt/fpn_pola-pvt-t_4xb2-80k_cityscapes-512x1024.py',
     (1024, 2048), 'Semantic FPN, Cityscapes, 80k it'),
    ('configs/pola_swin/mask2former_pola-swin-t_8xb2-90k_cityscapes-512x1024.py',
     (1024, 2048), 'Mask2Former, Cityscapes, 90k it'),
    ('configs/pola_swin/mask2former_swin-t_8xb2-160k_ade20k-512x512.py',
     (512, 512), 'Mask2Former, ADE20K, 160k it'),
    ('configs/pola_swin/mask2former_pola-swin-s-p4-w7-224_8xb2-lsj-50e_coco-panoptic.py',
     (800, 1333), 'Mask2Former, COCO panoptic, 368750 it'),
    ('configs/pola_pvt/cascade-mask-rcnn_pvt-m_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py',
     (800, 1333), 'Cascade Mask R-CNN, COCO, 3x (36 ep)'),
])
def test_flops_size_and_gain_table_group(path, shape, group):
    """get_flops.py and the gain table measure Cityscapes configs at the whole-image size
    they are evaluated at, the others at their scope's size; the gain table names the
    model, dataset and schedule of every new kind of config."""
    from polaformer_mm.analysis.flops import default_shape
    from polaformer_mm.analysis.gain_table import group_of
    cfg = _load(path)
    assert tuple(default_shape(cfg)) == shape
    assert group_of(cfg) == group
