"""The softmax checkpoint layouts the warm start reads: those every registered backbone
family declares (``BackboneFamily.layouts``, :mod:`polaformer_mm.models.family`), in the
parts of :mod:`polaformer_mm.models.checkpoint_layouts`.
"""
import re
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..backbones.base import POLA_KEYS
from ..checkpoint_layouts import (Builder, Converted, Layout, classifier_part, identity, lacks,
                                  matches)
from ..family import families

__all__ = ['Converted', 'Layout', 'POLA_KEYS', 'all_layouts', 'find_layout', 'layouts_of']


def all_layouts() -> List[Layout]:
    """Every layout of every registered family, family by family."""
    names = {family.name for family in families()}
    return [layout for family in families() for layout in family.layouts
            ] + [layout for layout in _PENDING if layout.family not in names]


# PENDING: moves to the families' modules (the family spec, issue 45)
PENDING_BACKBONES = {'PolaPVTv2': ('pvtv2', 'PVTv2'), 'PolaViT': ('vit', 'DeiT / ViT')}


def _pvtv2_official(state_dict: Dict[str, Tensor]) -> Converted:
    """whai362/PVT (v2) keys (``patch_embed1``, ``block1.0.attn.q``, ``mlp.dwconv``,
    ``norm1``) by mmdet's own ``pvt_convert`` to mmdet's PyramidVisionTransformerV2
    keys, the twin's (the file key of every tensor found back by its storage; the
    ``in_proj`` joined from ``q`` and ``kv``)."""
    from mmdet.models.backbones.pvt import pvt_convert
    out = Builder()
    owner = {v.data_ptr(): k for k, v in state_dict.items()}
    for key, value in pvt_convert(state_dict).items():
        joined = re.match(r'^layers\.(\d+)\.1\.(\d+)\.attn\.attn\.in_proj_(weight|bias)$', key)
        if joined:
            block = f'block{int(joined[1]) + 1}.{joined[2]}.attn.'
            q, kv = f'{block}q.{joined[3]}', f'{block}kv.{joined[3]}'
            dims = state_dict[q].shape[0]
            out.put(key, value, q, f'rows 0:{dims}, with {kv} as rows {dims}:{3 * dims}')
            out.pieces[key] = [(0, dims, q), (dims, 3 * dims, kv)]
            continue
        source = owner.get(value.data_ptr(), key)
        how = ('linear weight as a 1x1 conv'
               if source in state_dict and state_dict[source].dim() != value.dim() else '')
        out.put(key, value, source, how)
    named = {o[0] for o in out.origin.values()}
    named.update(p[2] for pieces in out.pieces.values() for p in pieces)
    for key in state_dict:
        if key not in named:
            out.drop(key, classifier_part(key))
    return out.result()


# ---------------------------------------------------------------- DeiT / ViT --------

_DEIT_BLOCK = [('norm1.', 'ln1.'), ('norm2.', 'ln2.'), ('attn.', 'attn.'),
               ('mlp.fc1.', 'ffn.layers.0.0.'), ('mlp.fc2.', 'ffn.layers.1.')]


def _drop_distillation(out: Builder, state_dict: Dict[str, Tensor], key: str) -> None:
    """A distilled DeiT's ``dist_token`` and its row (1) of the position embedding."""
    value = state_dict[key]
    if 'dist_token' in state_dict:
        out.put('pos_embed', torch.cat([value[:, :1], value[:, 2:]], dim=1), key,
                'distillation-token row dropped')
    else:
        out.put('pos_embed', value, key)


def _vit_mm(state_dict: Dict[str, Tensor]) -> Converted:
    """mmpretrain's VisionTransformer keys (the twin's); a distilled DeiT's
    distillation token is dropped."""
    out = Builder()
    for key, value in state_dict.items():
        if key == 'dist_token':
            out.drop(key, 'distillation token')
        elif key == 'pos_embed':
            _drop_distillation(out, state_dict, key)
        else:
            out.put(key, value, key)
    return out.result()


def _vit_official(state_dict: Dict[str, Tensor]) -> Converted:
    """The official DeiT / timm ViT keys: ``cls_token``, ``pos_embed``,
    ``patch_embed.proj``, ``blocks.{j}`` (``norm1``, ``attn.qkv``, ``attn.proj``,
    ``norm2``, ``mlp.fc1``, ``mlp.fc2``), ``norm``, ``head`` (and ``dist_token`` /
    ``head_dist`` of the distilled models) -> mmpretrain's VisionTransformer keys."""
    out = Builder()
    for key, value in state_dict.items():
        block = re.match(r'^blocks\.(\d+)\.(.+)$', key)
        if key.startswith(('head.', 'head_dist.')):
            out.drop(key, 'classifier head')
        elif key == 'dist_token':
            out.drop(key, 'distillation token')
        elif key == 'pos_embed':
            _drop_distillation(out, state_dict, key)
        elif key.startswith('patch_embed.proj.'):
            out.put(key.replace('.proj.', '.projection.', 1), value, key)
        elif key.startswith('norm.'):
            out.put('ln1.' + key[len('norm.'):], value, key)
        elif block:
            rest = block[2]
            for old, new in _DEIT_BLOCK:
                if rest.startswith(old):
                    rest = new + rest[len(old):]
                    break
            out.put(f'layers.{block[1]}.{rest}', value, key)
        else:
            out.put(key, value, key)
    return out.result()


_PVTV2_RELEASE = (r'^patch_embed1\.proj\.weight$', r'^block1\.\d+\.mlp\.dwconv\.')
_PVTV2_OWN = (r'^layers\.\d+\.0\.projection\.weight$', r'^layers\.\d+\.2\.weight$',
              r'^layers\.\d+\.1\.\d+\.ffn\.layers\.1\.weight$')
_VIT_OFFICIAL = (r'^cls_token$', r'^patch_embed\.proj\.weight$',
                 r'^blocks\.\d+\.attn\.qkv\.weight$')
_VIT_MM = (r'^cls_token$', r'^patch_embed\.projection\.weight$',
           r'^layers\.\d+\.attn\.qkv\.weight$')
_PENDING = [
    Layout('pvtv2', "mmdet's PyramidVisionTransformerV2 (PolaPVTv2's own keys)",
           lambda k: matches(k, *_PVTV2_OWN) and lacks(k, r'^layers\.\d+\.1\.0\.pos_embed$'),
           identity),
    Layout('pvtv2', 'the official PVTv2 release (whai362/PVT)',
           lambda k: matches(k, *_PVTV2_RELEASE) and lacks(k, r'^pos_embed1$'), _pvtv2_official),
    Layout('vit', "mmpretrain's VisionTransformer (PolaViT's own keys)",
           lambda k: matches(k, *_VIT_MM), _vit_mm),
    Layout('vit', 'the official DeiT / timm ViT release', lambda k: matches(k, *_VIT_OFFICIAL),
           _vit_official),
]


def find_layout(keys: Sequence[str], family: str) -> Tuple[Optional[Layout], List[Layout]]:
    """The layout of ``family`` that reads ``keys`` (None if there is none), and the
    layouts of other families that recognise them."""
    keys = list(keys)
    for layout in layouts_of(family):
        if layout.detect(keys):
            return layout, []
    return None, [lay for lay in all_layouts() if lay.family != family and lay.detect(keys)]


def layouts_of(family: str) -> List[Layout]:
    """The layouts a family's warm start reads."""
    return [lay for lay in all_layouts() if lay.family == family and lay.convert is not None]
