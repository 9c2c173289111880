"""Helpers for the golden files of the official code (tests/data/golden)."""
import os.path as osp

import torch
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS as PRETRAIN_MODELS

from polaformer_mm.models.official_weights import convert_official_state_dict

GOLDEN_FILES = [
    'pola_pvt_micro_LLLL.pt', 'pola_pvt_micro_LLSS_sr8421.pt', 'pola_swin_micro_LLSS.pt',
    'pola_swin_micro_LLSS_448.pt'
]


def load_golden(golden_dir, name):
    data = torch.load(osp.join(golden_dir, name), weights_only=True)
    # parameters and input are stored as float16 values exact in float16
    data['state_dict'] = {
        k: v.float() if v.is_floating_point() else v
        for k, v in data['state_dict'].items()
    }
    data['input'] = data['input'].float()
    return data


def backbone_cfg(kind, arch, linear_window_size='official', **overrides):
    """Our backbone config for the official constructor arguments ``arch``.

    ``linear_window_size`` of Pola-Swin: 'official' takes the official
    ``window_size`` (the 'L' window), None selects the global form; ``overrides``
    replace any other key."""
    if kind == 'pola_pvt':
        assert linear_window_size == 'official', 'Pola-PVT has no windows'
        cfg = dict(
            type='PolaPVT',
            arch=dict(
                embed_dims=arch['embed_dims'],
                depths=arch['depths'],
                num_heads=arch['num_heads'],
                mlp_ratios=arch['mlp_ratios'],
                sr_ratios=arch['sr_ratios']),
            attn_types=arch['attn_type'],
            la_sr_ratios=arch['la_sr_ratios'],
            alpha=arch['alpha'],
            kernel_size=arch['kernel_size'],
            patch_size=arch['patch_size'])
    else:
        assert kind == 'pola_swin'
        window = arch.get('window_size', 56)
        cfg = dict(
            type='PolaSwin',
            arch=dict(
                embed_dims=arch['embed_dim'], depths=arch['depths'], num_heads=arch['num_heads']),
            attn_types=arch['attn_type'],
            # the official 'S' window: 7, or 12 where the 'L' window exceeds 56
            window_size=7 if window <= 56 else 12,
            linear_window_size=(window if linear_window_size == 'official' else linear_window_size),
            pretrain_img_size=arch.get('img_size', 224),
            alpha=arch['alpha'],
            kernel_size=arch['kernel_size'],
            drop_path_rate=arch['drop_path_rate'])
    cfg.update(overrides)
    return cfg


def classifier_cfg(kind, arch, num_classes, **backbone_kwargs):
    backbone = backbone_cfg(kind, arch, **backbone_kwargs)
    backbone['out_indices'] = (3, )
    in_channels = (
        arch['embed_dims'][-1] if kind == 'pola_pvt' else arch['embed_dim']
        * 2**(len(arch['depths']) - 1))
    return dict(
        type='ImageClassifier',
        backbone=backbone,
        neck=dict(type='GlobalAveragePooling'),
        head=dict(type='LinearClsHead', num_classes=num_classes, in_channels=in_channels))


def build_classifier(data, **backbone_kwargs):
    """mmpretrain ImageClassifier for a golden file's arch (not loaded)."""
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return PRETRAIN_MODELS.build(
            classifier_cfg(data['kind'], data['arch'], data['logits'].shape[-1], **backbone_kwargs))


def build_golden_classifier(data, **backbone_kwargs):
    model = build_classifier(data, **backbone_kwargs)
    model.load_state_dict(convert_official_state_dict(data['state_dict']), strict=True)
    return model.eval()
