"""The key layouts of softmax checkpoints, and their conversion to the key layout of a
Pola backbone's softmax twin (the same backbone with every block 'S').

A :class:`Layout` recognises a file by its keys and renames (and where needed reshapes
or reorders) its tensors; every tensor of the file ends up either under a key of the
twin (with the file key it came from, :attr:`Converted.origin`) or as dropped, with the
reason (:attr:`Converted.dropped`: a classifier head, a buffer the model rebuilds). A
key no rule knows keeps its name, so that the strict load into the twin names it.
"""
import re
from collections import OrderedDict
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..official_weights import PVT_RULES, SWIN_RULES

#: the families a warm start knows, by the Pola backbone class that carries them
FAMILY_OF_BACKBONE = {
    'PolaPVT': 'pvt',
    'PolaSwin': 'swin',
    'PolaPVTv2': 'pvtv2',
    'PolaViT': 'vit',
}
FAMILY_NAMES = {
    'pvt': 'PVT v1',
    'swin': 'Swin',
    'pvtv2': 'PVTv2',
    'vit': 'DeiT / ViT',
}


class Converted(NamedTuple):
    """A softmax file in the twin's key layout."""
    state_dict: 'OrderedDict[str, Tensor]'  #: twin key -> tensor
    origin: Dict[str, Tuple[str, str]]  #: twin key -> (file key, how it was changed or '')
    dropped: Dict[str, str]  #: file key -> why it has no place in the backbone
    #: twin key -> [(first row, end row, file key)] for a tensor joined from several
    pieces: Dict[str, List[Tuple[int, int, str]]] = {}


class Layout(NamedTuple):
    """One key layout of softmax checkpoints of a family."""
    family: str  #: 'pvt', 'swin', 'pvtv2' or 'vit'
    name: str  #: e.g. 'the official PVT v1 release (whai362/PVT)'
    detect: Callable[[Sequence[str]], bool]  #: whether a file's keys are in this layout
    convert: Callable[[Dict[str, Tensor]], Converted]  #: the file in the twin's layout


class _Builder:
    """Collects a :class:`Converted`."""

    def __init__(self):
        self.state_dict, self.origin, self.dropped = OrderedDict(), {}, {}
        self.pieces = {}

    def put(self, key: str, value: Tensor, source: str, how: str = '') -> None:
        if key in self.state_dict:
            raise KeyError(f'file keys {self.origin[key][0]!r} and {source!r} both map '
                           f'to {key!r}')
        self.state_dict[key] = value
        self.origin[key] = (source, how)

    def drop(self, source: str, why: str) -> None:
        self.dropped[source] = why

    def result(self) -> Converted:
        return Converted(self.state_dict, self.origin, self.dropped, self.pieces)


def _matches(keys: Sequence[str], *patterns: str) -> bool:
    """Whether every regex of ``patterns`` matches (``re.match``) one of ``keys``."""
    return all(any(re.match(p, k) for k in keys) for p in patterns)


def _lacks(keys: Sequence[str], *patterns: str) -> bool:
    return not any(re.match(p, k) for p in patterns for k in keys)


def _rule_target(key: str, rules) -> Tuple[bool, Optional[str]]:
    """(matched, new key) by the first rule of ``rules`` (official_weights' rule lists)
    whose pattern matches ``key``; a matched rule with no target gives None."""
    for pattern, target in rules:
        match = pattern.match(key)
        if match is not None:
            return True, (target(match) if callable(target) else target)
    return False, None


def identity(state_dict: Dict[str, Tensor]) -> Converted:
    """A file already in the twin's layout."""
    out = _Builder()
    for key, value in state_dict.items():
        out.put(key, value, key)
    return out.result()


# ---------------------------------------------------------------- PVT v1 ------------


def _pvt_official(state_dict: Dict[str, Tensor]) -> Converted:
    """whai362/PVT (v1) keys: ``patch_embed1``, ``pos_embed1``, ``block1.0.attn.q`` ...
    (the rules of the official PolaFormer PVT files, whose layout is PVT's); the class
    token, the final norm and the head of the classifier are dropped, and so is the
    class-token row of the last stage's position embedding."""
    out = _Builder()
    stages = sorted(int(m[1]) for m in map(re.compile(r'^pos_embed(\d+)$').match, state_dict) if m)
    for key, value in state_dict.items():
        if key in ('cls_token', 'dist_token'):
            out.drop(key, 'class token of the classifier')
        elif key.startswith('head.'):
            out.drop(key, 'classifier head')
        elif key.startswith('norm.'):
            out.drop(key, 'final norm of the classifier')
        elif (len(stages) > 1 and key == f'pos_embed{stages[-1]}'
              and value.shape[1] == state_dict[f'pos_embed{stages[-2]}'].shape[1] // 4 + 1):
            out.put(f'layers.{stages[-1] - 1}.pos_embed', value[:, 1:], key,
                    'class-token row dropped')
        else:
            _, new_key = _rule_target(key, PVT_RULES)
            out.put(new_key or key, value, key)
    return out.result()


_MMDET_PVT_BLOCK = [
    ('norm1.', 'norm1.'),
    ('norm2.', 'norm2.'),
    ('attn.attn.out_proj.', 'attn.proj.'),
    ('attn.sr.', 'attn.reduction.sr.'),
    ('attn.norm.', 'attn.reduction.norm.'),
    ('ffn.layers.0.', 'mlp.fc1.'),
    ('ffn.layers.3.', 'mlp.fc2.'),
]


def _pvt_mmdet(state_dict: Dict[str, Tensor]) -> Converted:
    """mmdet's PyramidVisionTransformer keys: ``layers.{i}.0`` patch embedding,
    ``layers.{i}.1.0.pos_embed``, ``layers.{i}.1.{j+1}`` blocks (an
    ``nn.MultiheadAttention`` and 1x1-conv FFN layers)."""
    out = _Builder()
    for key, value in state_dict.items():
        match = re.match(r'^layers\.(\d+)\.(0|1\.(\d+))\.(.+)$', key)
        if match is None:
            out.put(key, value, key)
            continue
        stage, block, rest = match[1], match[3], match[4]
        if block is None:  # the patch embedding
            out.put(f'layers.{stage}.patch_embed.{rest.replace("projection.", "proj.", 1)}', value,
                    key)
        elif block == '0' and rest == 'pos_embed':
            out.put(f'layers.{stage}.pos_embed', value, key)
        else:
            prefix = f'layers.{stage}.blocks.{int(block) - 1}.'
            _pvt_mmdet_block(out, prefix, key, rest, value)
    return out.result()


def _pvt_mmdet_block(out: _Builder, prefix: str, key: str, rest: str, value: Tensor) -> None:
    """One tensor of an mmdet PVT block, under the twin block ``prefix``."""
    in_proj = re.match(r'^attn\.attn\.in_proj_(weight|bias)$', rest)
    if in_proj:
        dims = value.shape[0] // 3
        out.put(f'{prefix}attn.q.{in_proj[1]}', value[:dims], key, f'rows 0:{dims}')
        out.put(f'{prefix}attn.kv.{in_proj[1]}', value[dims:], key, f'rows {dims}:{3 * dims}')
        return
    for old, new in _MMDET_PVT_BLOCK:
        if rest.startswith(old):
            how = ''
            if new.startswith('mlp.') and value.dim() == 4:
                value, how = value.flatten(1), '1x1 conv weight as a linear one'
            out.put(prefix + new + rest[len(old):], value, key, how)
            return
    out.put(key, value, key)


# ---------------------------------------------------------------- Swin --------------


def _swin_official(state_dict: Dict[str, Tensor]) -> Converted:
    """microsoft/Swin-Transformer keys: ``patch_embed.proj``, ``layers.{i}.blocks.{j}``
    (``attn.qkv``, ``mlp.fc1``), ``layers.{i}.downsample``, ``norm``, ``head`` (the
    rules of the official PolaFormer Swin files, whose layout is Swin's)."""
    out = _Builder()
    num_stages = 1 + max(
        (int(m[1]) for m in map(re.compile(r'^layers\.(\d+)\.').match, state_dict) if m),
        default=-1)
    for key, value in state_dict.items():
        if key.startswith('head.'):
            out.drop(key, 'classifier head')
        elif key.startswith('norm.'):
            out.put(f'norm{num_stages - 1}.{key[len("norm."):]}', value, key)
        else:
            matched, new_key = _rule_target(key, SWIN_RULES)
            if matched and new_key is None:
                out.drop(key, 'buffer (the model rebuilds it)')
            else:
                out.put(new_key or key, value, key)
    return out.result()


def _unfold_inverse(channels: int, kind: str) -> Tensor:
    """The channel order that undoes mmdet's ``swin_converter`` reordering of a patch
    merging ``kind`` ('reduction' or 'norm') of ``channels`` (4C) input channels:
    mmdet's and mmpretrain's PatchMerging gather the 2x2 neighbourhood with
    ``nn.Unfold``, the official one (and the twin) by concatenation."""
    from mmdet.models.backbones.swin import swin_converter
    index = torch.arange(channels, dtype=torch.float64)
    key = f'layers.0.downsample.{kind}.weight'
    moved = swin_converter({key: index[None] if kind == 'reduction' else index})
    order = moved[f'backbone.stages.0.downsample.{kind}.weight'].reshape(-1).long()
    return torch.argsort(order)


def _swin_mm(state_dict: Dict[str, Tensor]) -> Converted:
    """mmdet's / mmpretrain's SwinTransformer keys: ``patch_embed.projection``,
    ``stages.{i}.blocks.{j}`` (``attn.w_msa.qkv``, ``ffn.layers.0.0``,
    ``ffn.layers.1``), ``stages.{i}.downsample`` (unfold channel order),
    ``norm{i}``."""
    out = _Builder()
    renames = [('attn.w_msa.', 'attn.'), ('ffn.layers.0.0.', 'mlp.fc1.'),
               ('ffn.layers.1.', 'mlp.fc2.')]
    for key, value in state_dict.items():
        block = re.match(r'^(stages\.\d+\.blocks\.\d+\.)(.+)$', key)
        merge = re.match(r'^stages\.\d+\.downsample\.(reduction|norm)\.(weight|bias)$', key)
        if key.endswith('relative_position_index'):
            out.drop(key, 'buffer (the model rebuilds it)')
        elif key.startswith('patch_embed.projection.'):
            out.put(key.replace('projection.', 'proj.', 1), value, key)
        elif block:
            rest = block[2]
            for old, new in renames:
                if rest.startswith(old):
                    rest = new + rest[len(old):]
                    break
            out.put(block[1] + rest, value, key)
        elif merge:
            order = _unfold_inverse(value.shape[-1], merge[1])
            out.put(key, value[..., order], key,
                    'input channels from the unfold order to the official one')
        else:
            out.put(key, value, key)
    return out.result()


# ---------------------------------------------------------------- PVTv2 -------------


def _classifier_part(key: str) -> str:
    """Why a file key of a classification release has no place in a backbone."""
    if key.startswith(('head.', 'head_dist.')):
        return 'classifier head'
    if key.startswith('norm.'):
        return 'final norm of the classifier'
    if key in ('cls_token', 'dist_token'):
        return 'class token of the classifier'
    return 'not read by the converter'


def _pvtv2_official(state_dict: Dict[str, Tensor]) -> Converted:
    """whai362/PVT (v2) keys (``patch_embed1``, ``block1.0.attn.q``, ``mlp.dwconv``,
    ``norm1``) by mmdet's own ``pvt_convert`` to mmdet's PyramidVisionTransformerV2
    keys, the twin's (the file key of every tensor found back by its storage; the
    ``in_proj`` joined from ``q`` and ``kv``)."""
    from mmdet.models.backbones.pvt import pvt_convert
    out = _Builder()
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
            out.drop(key, _classifier_part(key))
    return out.result()


# ---------------------------------------------------------------- DeiT / ViT --------

_DEIT_BLOCK = [('norm1.', 'ln1.'), ('norm2.', 'ln2.'), ('attn.', 'attn.'),
               ('mlp.fc1.', 'ffn.layers.0.0.'), ('mlp.fc2.', 'ffn.layers.1.')]


def _drop_distillation(out: _Builder, state_dict: Dict[str, Tensor], key: str) -> None:
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
    out = _Builder()
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
    out = _Builder()
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


# ---------------------------------------------------------------- registry ----------

_PVT_OWN = (r'^layers\.\d+\.patch_embed\.proj\.weight$', r'^layers\.\d+\.blocks\.\d+\.attn\.q\.')
_PVT_V1 = (r'^patch_embed1\.proj\.weight$', r'^pos_embed1$', r'^block1\.\d+\.attn\.q\.weight$')
_PVT_MMDET = (r'^layers\.\d+\.0\.projection\.weight$', r'^layers\.\d+\.1\.0\.pos_embed$',
              r'^layers\.\d+\.1\.\d+\.attn\.attn\.in_proj_weight$')
_PVTV2_RELEASE = (r'^patch_embed1\.proj\.weight$', r'^block1\.\d+\.mlp\.dwconv\.')
_PVTV2_OWN = (r'^layers\.\d+\.0\.projection\.weight$', r'^layers\.\d+\.2\.weight$',
              r'^layers\.\d+\.1\.\d+\.ffn\.layers\.1\.weight$')
_SWIN_OWN = (r'^patch_embed\.proj\.weight$', r'^stages\.\d+\.blocks\.\d+\.attn\.qkv\.weight$')
_SWIN_OFFICIAL = (r'^patch_embed\.proj\.weight$', r'^layers\.\d+\.blocks\.\d+\.attn\.qkv\.weight$')
_SWIN_MM = (r'^patch_embed\.projection\.weight$',
            r'^stages\.\d+\.blocks\.\d+\.attn\.w_msa\.qkv\.weight$')
_VIT_OFFICIAL = (r'^cls_token$', r'^patch_embed\.proj\.weight$',
                 r'^blocks\.\d+\.attn\.qkv\.weight$')
_VIT_MM = (r'^cls_token$', r'^patch_embed\.projection\.weight$',
           r'^layers\.\d+\.attn\.qkv\.weight$')

#: every layout, by family
LAYOUTS: List[Layout] = [
    Layout('pvt', 'PolaPVT with softmax stages', lambda k: _matches(k, *_PVT_OWN), identity),
    Layout('pvt', 'the official PVT v1 release (whai362/PVT)', lambda k: _matches(k, *_PVT_V1),
           _pvt_official),
    Layout('pvt', "mmdet's PyramidVisionTransformer", lambda k: _matches(k, *_PVT_MMDET),
           _pvt_mmdet),
    Layout('swin', 'PolaSwin with softmax stages', lambda k: _matches(k, *_SWIN_OWN), identity),
    Layout('swin', 'the official Swin release (microsoft/Swin-Transformer)',
           lambda k: _matches(k, *_SWIN_OFFICIAL), _swin_official),
    Layout('swin', "mmdet's / mmpretrain's SwinTransformer", lambda k: _matches(k, *_SWIN_MM),
           _swin_mm),
    Layout('pvtv2', "mmdet's PyramidVisionTransformerV2 (PolaPVTv2's own keys)",
           lambda k: _matches(k, *_PVTV2_OWN) and _lacks(k, r'^layers\.\d+\.1\.0\.pos_embed$'),
           identity),
    Layout('pvtv2', 'the official PVTv2 release (whai362/PVT)',
           lambda k: _matches(k, *_PVTV2_RELEASE) and _lacks(k, r'^pos_embed1$'), _pvtv2_official),
    Layout('vit', "mmpretrain's VisionTransformer (PolaViT's own keys)",
           lambda k: _matches(k, *_VIT_MM), _vit_mm),
    Layout('vit', 'the official DeiT / timm ViT release', lambda k: _matches(k, *_VIT_OFFICIAL),
           _vit_official),
]

#: keys only Pola attention has (official PolaFormer files and ours alike)
POLA_KEYS = r'(^|\.)attn\.(qg|qkvg|power|positional_encoding)(\.|$)'


def find_layout(keys: Sequence[str], family: str) -> Tuple[Optional[Layout], List[Layout]]:
    """The layout of ``family`` that reads ``keys`` (None if there is none), and the
    layouts of other families that recognise them."""
    keys = list(keys)
    own = [lay for lay in LAYOUTS if lay.family == family and lay.convert is not None]
    for layout in own:
        if layout.detect(keys):
            return layout, []
    return None, [lay for lay in LAYOUTS if lay.family != family and lay.detect(keys)]


def layouts_of(family: str) -> List[Layout]:
    """The layouts a family's warm start reads."""
    return [lay for lay in LAYOUTS if lay.family == family and lay.convert is not None]
