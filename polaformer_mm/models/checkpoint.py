"""Reading official PolaFormer checkpoints and converting them to our modules.

Official files are ``{'model': state_dict, 'optimizer', 'lr_scheduler', 'max_accuracy',
'epoch', 'config'}`` where 'config' is a pickled ``yacs.config.CfgNode``. They are read
with ``torch.load(weights_only=True)``: the only addition to torch's allow-list is an inert
stand-in for ``CfgNode`` (the node is read back as an OrderedDict), so yacs need not be
installed and no other object can be unpickled.
"""
import os
import os.path as osp
import pickle
import re
from collections import OrderedDict
from typing import Dict, Optional
from urllib.parse import urlparse

import torch

from ..version import __version__

PVT_KIND, SWIN_KIND = 'pvt', 'swin'


class _CfgNodeStandIn:
    """Stands in for ``yacs.config.CfgNode`` during a weights-only load.

    A pickled CfgNode is rebuilt as ``NEWOBJ(CfgNode)``, ``SETITEMS``, ``BUILD(attrs)``;
    torch's weights-only unpickler applies SETITEMS / BUILD only to plain dicts and
    OrderedDicts, so the node becomes an ``OrderedDict`` (attributes in ``__dict__``).
    No yacs code runs and nothing else becomes loadable.
    """

    def __new__(cls, *args):
        return OrderedDict()


_CfgNodeStandIn.__module__ = 'yacs.config'
_CfgNodeStandIn.__name__ = _CfgNodeStandIn.__qualname__ = 'CfgNode'


def _local_path(path: str) -> str:
    """A local file for ``path``; http(s) URLs are downloaded once into torch's hub
    cache (``$TORCH_HOME/hub/checkpoints``), as mmengine does for its URLs."""
    url = urlparse(path)
    scheme = url.scheme
    if scheme in ('http', 'https'):
        cached = osp.join(torch.hub.get_dir(), 'checkpoints', osp.basename(url.path))
        if not osp.isfile(cached):
            os.makedirs(osp.dirname(cached), exist_ok=True)
            torch.hub.download_url_to_file(path, cached, progress=False)
        return cached
    if len(scheme) > 1:  # not a Windows drive letter
        raise ValueError(
            f'checkpoint {path!r}: polaformer_mm reads local files and http(s) URLs, '
            f'not {scheme}:// (a base config\'s model.pretrained? set it to None)')
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path!r}')
    return path


def load_checkpoint_file(path: str) -> dict:
    """``torch.load(path, weights_only=True)`` that also accepts a yacs config.
    ``path`` is a local file or an http(s) URL."""
    path = _local_path(os.fspath(path))
    try:
        with torch.serialization.safe_globals([_CfgNodeStandIn]):
            return torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as err:
        raise RuntimeError(
            f'{path!r} holds objects that a weights-only load refuses; only tensors, '
            f'plain containers and a yacs config are accepted. ({err})') from err


def extract_state_dict(obj, source: str = 'checkpoint') -> Dict[str, torch.Tensor]:
    if isinstance(obj, dict):
        for key in ('state_dict', 'model'):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(
            isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f'{source} holds no state dict (expected a dict of tensors, '
                         "or one under 'state_dict' or 'model')")
    return obj


def detect_official_kind(state_dict) -> Optional[str]:
    """'pvt' / 'swin' for official key layouts, None otherwise."""
    keys = list(state_dict)
    if any(k.startswith(('patch_embed1.', 'block1.')) for k in keys):
        return PVT_KIND
    if any(k.startswith('layers.0.blocks.') for k in keys):
        return SWIN_KIND
    return None


_PVT_RULES = [
    (re.compile(r'^pos_embed(\d)$'), lambda m: f'layers.{int(m[1]) - 1}.pos_embed'),
    (re.compile(r'^patch_embed(\d)\.(.+)$'),
     lambda m: f'layers.{int(m[1]) - 1}.patch_embed.{m[2]}'),
    (re.compile(r'^block(\d)\.(\d+)\.attn\.(sr|norm)\.(.+)$'),
     lambda m: f'layers.{int(m[1]) - 1}.blocks.{m[2]}.attn.reduction.{m[3]}.{m[4]}'),
    (re.compile(r'^block(\d)\.(\d+)\.(.+)$'),
     lambda m: f'layers.{int(m[1]) - 1}.blocks.{m[2]}.{m[3]}'),
    (re.compile(r'^head\.(weight|bias)$'), lambda m: f'head.fc.{m[1]}'),
    # the final norm exists in official PVT checkpoints but the classifier never uses it
    (re.compile(r'^norm\.(weight|bias)$'), None),
]

_SWIN_RULES = [
    (re.compile(r'^layers\.\d+\.blocks\.\d+\.(attn_mask|attn\.relative_position_index)$'),
     None),  # buffers rebuilt for the runtime size
    (re.compile(r'^patch_embed\.(.+)$'), lambda m: f'patch_embed.{m[1]}'),
    (re.compile(r'^layers\.(\d+)\.(blocks\.\d+\..+|downsample\..+)$'),
     lambda m: f'stages.{m[1]}.{m[2]}'),
    (re.compile(r'^norm\.(weight|bias)$'), 'FINAL_NORM'),
    (re.compile(r'^head\.(weight|bias)$'), lambda m: f'head.fc.{m[1]}'),
]


def convert_official_state_dict(state_dict: Dict[str, torch.Tensor],
                                kind: Optional[str] = None
                                ) -> 'OrderedDict[str, torch.Tensor]':
    """Official PolaFormer keys -> mmpretrain ImageClassifier keys
    (``backbone.*`` for PolaPVT / PolaSwin, ``head.fc.*`` for the classifier)."""
    detected = detect_official_kind(state_dict)
    if detected is None:
        raise KeyError('not an official PolaFormer state dict: found neither '
                       "'patch_embed1.*' / 'block1.*' (PVT) nor 'layers.0.blocks.*' "
                       f'(Swin) keys; first keys: {list(state_dict)[:5]}')
    if kind is not None and kind != detected:
        raise ValueError(f'checkpoint holds an official Pola-{detected.upper()} '
                         f'model, but a Pola-{kind.upper()} backbone asked for it')
    rules = _PVT_RULES if detected == PVT_KIND else _SWIN_RULES
    num_swin_stages = 1 + max(
        (int(m[1]) for m in map(re.compile(r'^layers\.(\d+)\.').match, state_dict)
         if m), default=-1)

    out, unknown = OrderedDict(), []
    for key, value in state_dict.items():
        for pattern, target in rules:
            match = pattern.match(key)
            if match is None:
                continue
            if target is None:
                break
            if target == 'FINAL_NORM':
                new_key = f'norm{num_swin_stages - 1}.{match[1]}'
            else:
                new_key = target(match)
            if not new_key.startswith('head.'):
                new_key = 'backbone.' + new_key
            out[new_key] = value
            break
        else:
            unknown.append(key)
    if unknown:
        raise KeyError(f'official Pola-{detected.upper()} checkpoint has keys this '
                       f'converter does not know: {unknown[:10]}')
    return out


def convert_official_checkpoint(src: str, dst: str) -> Dict[str, torch.Tensor]:
    """Read an official checkpoint and write ``{'state_dict', 'meta'}`` for mm*."""
    state_dict = extract_state_dict(load_checkpoint_file(src), source=src)
    kind = detect_official_kind(state_dict)
    converted = convert_official_state_dict(state_dict)
    dst_dir = osp.dirname(osp.abspath(dst))
    os.makedirs(dst_dir, exist_ok=True)
    meta = dict(
        source=osp.basename(src),
        backbone='PolaPVT' if kind == PVT_KIND else 'PolaSwin',
        converted_by=f'polaformer_mm {__version__}')
    torch.save(dict(state_dict=converted, meta=meta), dst)
    return converted


def load_backbone_weights(checkpoint: str, kind: str,
                          prefix: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """Backbone state dict from a converted file (prefix stripped; without a prefix,
    'backbone.' is stripped when present), a bare backbone state dict, or an official
    checkpoint (converted on the fly)."""
    if not checkpoint:
        raise ValueError("init_cfg type='Pretrained' needs a 'checkpoint' path")
    state_dict = extract_state_dict(load_checkpoint_file(checkpoint),
                                    source=checkpoint)
    if detect_official_kind(state_dict) is not None:
        state_dict = convert_official_state_dict(state_dict, kind=kind)
        prefix = 'backbone.'
    elif prefix is None and any(k.startswith('backbone.') for k in state_dict):
        prefix = 'backbone.'  # a whole-model checkpoint (ours, or mmdet/mmseg/mmpretrain)
    if prefix:
        stripped = {
            k[len(prefix):]: v
            for k, v in state_dict.items() if k.startswith(prefix)
        }
        if not stripped:
            raise KeyError(f'no key of {checkpoint!r} starts with prefix {prefix!r}; '
                           f'first keys: {list(state_dict)[:5]}')
        state_dict = stripped
    return state_dict
