"""Softmax checkpoints in the upstream layouts, made from the real upstream modules.

mmdet's ``PyramidVisionTransformer`` / ``PyramidVisionTransformerV2`` /
``SwinTransformer`` and mmpretrain's ``VisionTransformer`` with seeded random weights
give the mmdet / mmpretrain-layout state dicts; the official release layouts
(whai362/PVT v1 and v2, microsoft/Swin-Transformer, facebookresearch/deit) are made from
them by renaming keys the other way round of mmdet's own readers (``pvt_convert``,
``swin_converter``), which the tests run on the results to show that mmdet reads them
back (DeiT: the key names of the DeiT / timm release).
"""
import re
from collections import OrderedDict

import torch

# small widths, one or two blocks: every kind of tensor, little compute
PVT_MMDET = dict(embed_dims=8, num_layers=[1, 2, 1, 1], num_heads=[1, 2, 5, 8], drop_path_rate=0.)
PVT_POLA = dict(
    arch=dict(
        embed_dims=[8, 16, 40, 64],
        depths=[1, 2, 1, 1],
        num_heads=[1, 2, 5, 8],
        mlp_ratios=[8, 8, 4, 4],
        sr_ratios=[8, 4, 2, 1]))
PVTV2_MMDET = dict(embed_dims=8, num_layers=[1, 2, 1, 1], num_heads=[1, 2, 5, 8], drop_path_rate=0.)
PVTV2_POLA = dict(arch=dict(PVT_POLA['arch']), drop_path_rate=0.)
VIT_ARCH = dict(embed_dims=32, num_layers=3, num_heads=2, feedforward_channels=64)
VIT_POLA = dict(arch=VIT_ARCH, pretrain_img_size=64, out_indices=(0, 2), drop_path_rate=0.)
SWIN_MMDET = dict(
    embed_dims=16, depths=[1, 2, 1, 1], num_heads=[1, 2, 4, 8], window_size=2, drop_path_rate=0.)
SWIN_POLA = dict(
    arch=dict(embed_dims=16, depths=[1, 2, 1, 1], num_heads=[1, 2, 4, 8]),
    window_size=2,
    drop_path_rate=0.)


def randomise(module, seed):
    """Seeded random values in every parameter (no tensor left at 0 or 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    module.eval()  # mmdet's SwinTransformer.train returns None
    return module


def mmdet_pvt(seed=0, **kwargs):
    from mmdet.models.backbones import PyramidVisionTransformer
    return randomise(PyramidVisionTransformer(**{**PVT_MMDET, **kwargs}), seed)


def mmdet_pvtv2(seed=0, **kwargs):
    from mmdet.models.backbones import PyramidVisionTransformerV2
    return randomise(PyramidVisionTransformerV2(**{**PVTV2_MMDET, **kwargs}), seed)


def mmpretrain_deit(seed=0, **kwargs):
    from mmpretrain.models.backbones import VisionTransformer
    kwargs = {
        'arch': VIT_ARCH,
        'img_size': 64,
        'out_indices': (0, 2),
        'out_type': 'featmap',
        **kwargs
    }
    return randomise(VisionTransformer(**kwargs), seed)


def mmdet_swin(seed=0, **kwargs):
    from mmdet.models.backbones import SwinTransformer
    return randomise(SwinTransformer(**{**SWIN_MMDET, **kwargs}), seed)


def classifier_extras(width, seed=1):
    """What a classification release adds: class token, final norm, head."""
    gen = torch.Generator().manual_seed(seed)
    return OrderedDict([('norm.weight', torch.randn(width, generator=gen)),
                        ('norm.bias', torch.randn(width, generator=gen)),
                        ('head.weight', torch.randn(10, width, generator=gen)),
                        ('head.bias', torch.randn(10, generator=gen))])


def pvt_release_layout(state_dict):
    """mmdet PVT v1 keys -> whai362/PVT (v1) release keys: q / kv apart, linear MLP
    weights, a class token with its row in the last position embedding, the final
    norm and the head."""
    out = OrderedDict()
    last = max(int(k.split('.')[1]) for k in state_dict) + 1
    for key, value in state_dict.items():
        m = re.match(r'^layers\.(\d+)\.(0|1\.(\d+))\.(.+)$', key)
        stage, rest = int(m[1]) + 1, m[4]
        if m[3] is None:
            out[f'patch_embed{stage}.{rest.replace("projection", "proj")}'] = value
            continue
        if rest == 'pos_embed':
            if stage == last:
                value = torch.cat([torch.full_like(value[:, :1], 0.5), value], dim=1)
            out[f'pos_embed{stage}'] = value
            continue
        block = f'block{stage}.{int(m[3]) - 1}.'
        in_proj = re.match(r'attn\.attn\.in_proj_(weight|bias)', rest)
        if in_proj:
            dims = value.shape[0] // 3
            out[f'{block}attn.q.{in_proj[1]}'] = value[:dims]
            out[f'{block}attn.kv.{in_proj[1]}'] = value[dims:]
            continue
        for old, new in (('attn.attn.out_proj.', 'attn.proj.'), ('ffn.layers.0.', 'mlp.fc1.'),
                         ('ffn.layers.3.', 'mlp.fc2.')):
            if rest.startswith(old):
                rest = new + rest[len(old):]
                value = value.flatten(1) if value.dim() == 4 else value
        out[block + rest] = value
    width = out[f'pos_embed{last}'].shape[-1]
    out['cls_token'] = torch.full((1, 1, width), 0.25)
    out.update(classifier_extras(width))
    return out


def pvtv2_release_layout(state_dict):
    """mmdet PVTv2 keys -> whai362/PVT (v2) release keys (``mlp.dwconv.dwconv``, stage
    norms ``norm{i}``), the final-norm-free classifier's head added."""
    out = OrderedDict()
    for key, value in state_dict.items():
        m = re.match(r'^layers\.(\d+)\.(0|1\.(\d+)|2)\.(.+)$', key)
        stage, part, rest = int(m[1]) + 1, m[2], m[4]
        if part == '0':
            out[f'patch_embed{stage}.{rest.replace("projection", "proj")}'] = value
        elif part == '2':
            out[f'norm{stage}.{rest}'] = value
        else:
            block = f'block{stage}.{m[3]}.'
            in_proj = re.match(r'attn\.attn\.in_proj_(weight|bias)', rest)
            if in_proj:
                dims = value.shape[0] // 3
                out[f'{block}attn.q.{in_proj[1]}'] = value[:dims]
                out[f'{block}attn.kv.{in_proj[1]}'] = value[dims:]
                continue
            for old, new in (('attn.attn.out_proj.', 'attn.proj.'), ('ffn.layers.0.', 'mlp.fc1.'),
                             ('ffn.layers.1.', 'mlp.dwconv.dwconv.'), ('ffn.layers.4.',
                                                                       'mlp.fc2.')):
                if rest.startswith(old):
                    rest = new + rest[len(old):]
                    if new.startswith(('mlp.fc1', 'mlp.fc2')) and value.dim() == 4:
                        value = value.flatten(1)
            out[block + rest] = value
    out.update(
        (k, v) for k, v in classifier_extras(value.shape[0]).items() if k.startswith('head.'))
    return out


def deit_release_layout(state_dict, distilled=False):
    """mmpretrain VisionTransformer keys -> DeiT / timm release keys (``blocks.{j}``,
    ``norm1``, ``mlp.fc1``, ``norm``, ``head``; ``dist_token``, its position row and
    ``head_dist`` for a distilled DeiT)."""
    out = OrderedDict()
    renames = [('ln1.', 'norm1.'), ('ln2.', 'norm2.'), ('ffn.layers.0.0.', 'mlp.fc1.'),
               ('ffn.layers.1.', 'mlp.fc2.')]
    for key, value in state_dict.items():
        block = re.match(r'^layers\.(\d+)\.(.+)$', key)
        if block:
            rest = block[2]
            for old, new in renames:
                if rest.startswith(old):
                    rest = new + rest[len(old):]
            out[f'blocks.{block[1]}.{rest}'] = value
        elif key.startswith('ln1.'):
            out['norm.' + key[len('ln1.'):]] = value
        elif key.startswith('patch_embed.projection.'):
            out[key.replace('projection', 'proj')] = value
        elif key == 'pos_embed' and distilled:
            out[key] = torch.cat(
                [value[:, :1], torch.full_like(value[:, :1], 0.5), value[:, 1:]], dim=1)
        else:
            out[key] = value
    width = out['cls_token'].shape[-1]
    heads = ('head', 'head_dist') if distilled else ('head', )
    for head in heads:
        out.update((k.replace('head', head), v) for k, v in classifier_extras(width).items()
                   if k.startswith('head.'))
    if distilled:
        out['dist_token'] = torch.full_like(out['cls_token'], 0.75)
    return out


def official_merge_order(channels):
    """Input channel j of the official PatchMerging (concat of the 2x2 positions
    (0,0), (1,0), (0,1), (1,1), C channels each) as an index into nn.Unfold's order
    (channel-major, positions (0,0), (0,1), (1,0), (1,1))."""
    C = channels // 4
    unfold_position = [0, 2, 1, 3]  # official position p -> unfold position
    return torch.tensor([c * 4 + unfold_position[p] for p in range(4) for c in range(C)])


def swin_release_layout(state_dict):
    """mmdet Swin keys -> microsoft/Swin-Transformer release keys (concat order of the
    patch merging, the final norm as ``norm``, the head; the other output norms are
    not in a classification release)."""
    out = OrderedDict()
    last = max(int(k[len('norm')]) for k in state_dict if re.match(r'^norm\d', k))
    for key, value in state_dict.items():
        if key.startswith('patch_embed.'):
            out[key.replace('projection', 'proj')] = value
        elif key.startswith('stages.'):
            new = key.replace('stages.', 'layers.', 1).replace('attn.w_msa.', 'attn.')
            new = new.replace('ffn.layers.0.0.', 'mlp.fc1.').replace('ffn.layers.1.', 'mlp.fc2.')
            if '.downsample.' in key:
                value = value[..., official_merge_order(value.shape[-1])]
            out[new] = value
        elif key.startswith(f'norm{last}.'):
            out['norm.' + key.split('.')[-1]] = value
    out.update((k, v) for k, v in classifier_extras(out['norm.weight'].shape[0]).items()
               if k.startswith('head.'))
    return out


def save(path, state_dict, prefix='', **extra):
    """An mm-style file ``{'state_dict': {prefix + key: ...}, 'meta'}``."""
    sd = OrderedDict((prefix + k, v) for k, v in state_dict.items())
    sd.update(extra)
    torch.save(dict(state_dict=sd, meta=dict(note='softmax test file')), path)
    return str(path)
