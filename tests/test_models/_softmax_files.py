"""Softmax checkpoints in the upstream layouts, made from the real upstream modules.

mmdet's ``PyramidVisionTransformer`` / ``SwinTransformer`` with seeded random weights
give the mmdet-layout state dicts; the official release layouts (whai362/PVT v1,
microsoft/Swin-Transformer) are made from them by renaming keys the other way round of
mmdet's own readers (``pvt_convert``, ``swin_converter``), which the tests run on the
results to show that mmdet reads them back.
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
