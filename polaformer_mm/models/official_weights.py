"""Converting official PolaFormer checkpoints to our modules, and backbone weights.

Official files are ``{'model': state_dict, 'optimizer', 'lr_scheduler', 'max_accuracy',
'epoch', 'config'}`` where 'config' is a pickled ``yacs.config.CfgNode``. Keys of a file
saved from a DDP-wrapped model (``module.`` first) are read without that prefix. Every file is
read by :func:`polaformer_mm.utils.checkpoint_io.load_checkpoint` (weights-only, with an
inert stand-in for ``CfgNode`` that reads the node back as an OrderedDict, so yacs need
not be installed; local paths, URLs and mmengine's other schemes).
"""
import os
import os.path as osp
import re
from collections import OrderedDict
from typing import Dict, Optional

import torch

from ..utils.checkpoint_io import (atomic_save, is_local_checkpoint, load_checkpoint,
                                   strip_ddp_prefix)
from ..version import __version__
from .family import family_named

PVT_FAMILY, SWIN_FAMILY = 'pvt', 'swin'
_SHOWN_BAD = 5  # non-finite tensors named in an error


class NonFiniteWeightsError(ValueError):
    """A weights file whose tensors hold NaN or infinity: nothing can be trained from it."""


def non_finite_keys(state_dict) -> list:
    """The keys of the floating-point tensors of ``state_dict`` that hold NaN or
    infinity, in the dict's order."""
    return [
        k for k, v in state_dict.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
        and not bool(torch.isfinite(v).all())
    ]


def refuse_non_finite(state_dict, source: str, what: str, key_prefix: str = '') -> None:
    """Raise :class:`NonFiniteWeightsError` when a tensor of ``state_dict`` (the weights
    ``what`` reads from the file ``source``) holds NaN or infinity; the message names the
    file, how many tensors and the first ones (their keys in the file: ``key_prefix`` +
    key)."""
    bad = non_finite_keys(state_dict)
    if not bad:
        return
    shown = ', '.join(key_prefix + k for k in bad[:_SHOWN_BAD])
    more = f', ... ({len(bad) - _SHOWN_BAD} more)' if len(bad) > _SHOWN_BAD else ''
    raise NonFiniteWeightsError(
        f'{source!r} holds weights that are not finite (NaN or infinity): {len(bad)} of the '
        f'{len(state_dict)} tensors {what} reads, first {shown}{more}. A model started from '
        'them stops at its first iteration; use an intact copy of the file (the one it was '
        'downloaded or converted from), or a checkpoint written before the run diverged')


def extract_state_dict(obj, source: str = 'checkpoint') -> Dict[str, torch.Tensor]:
    """The state dict of a loaded checkpoint: ``obj`` itself, or its ``state_dict``
    or ``model`` entry, with the ``module.`` prefix of a DDP-saved file stripped
    (:func:`~polaformer_mm.utils.checkpoint_io.strip_ddp_prefix`); a named error when
    there is none."""
    if isinstance(obj, dict):
        for key in ('state_dict', 'model'):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(
            isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f'{source} holds no state dict (expected a dict of tensors, '
                         "or one under 'state_dict' or 'model')")
    return strip_ddp_prefix(obj)


def detect_official_family(state_dict) -> Optional[str]:
    """'pvt' / 'swin' for official key layouts, None otherwise (our own PolaPVT keys,
    ``layers.0.blocks.*`` next to ``layers.0.patch_embed.*``, are not official Swin)."""
    keys = list(state_dict)
    if any(k.startswith(('patch_embed1.', 'block1.')) for k in keys):
        return PVT_FAMILY
    if any(k.startswith('layers.0.blocks.') for k in keys) and not any(
            k.startswith(('layers.0.patch_embed.', 'layers.0.pos_embed')) for k in keys):
        return SWIN_FAMILY
    return None


#: official PVT keys -> PolaPVT keys (PVT v1's own layout: the warm start reads it too)
PVT_RULES = [
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

#: official Swin keys -> PolaSwin keys (Swin's own layout: the warm start reads it too)
SWIN_RULES = [
    (re.compile(r'^layers\.\d+\.blocks\.\d+\.(attn_mask|attn\.relative_position_index)$'),
     None),  # buffers rebuilt for the runtime size
    (re.compile(r'^patch_embed\.(.+)$'), lambda m: f'patch_embed.{m[1]}'),
    (re.compile(r'^layers\.(\d+)\.(blocks\.\d+\..+|downsample\..+)$'),
     lambda m: f'stages.{m[1]}.{m[2]}'),
    (re.compile(r'^norm\.(weight|bias)$'), 'FINAL_NORM'),
    (re.compile(r'^head\.(weight|bias)$'), lambda m: f'head.fc.{m[1]}'),
]


def convert_official_state_dict(state_dict: Dict[str, torch.Tensor],
                                family: Optional[str] = None) -> 'OrderedDict[str, torch.Tensor]':
    """Official PolaFormer keys -> mmpretrain ImageClassifier keys
    (``backbone.*`` for PolaPVT / PolaSwin, ``head.fc.*`` for the classifier)."""
    detected = detect_official_family(state_dict)
    if detected is None:
        raise KeyError('not an official PolaFormer state dict: found neither '
                       "'patch_embed1.*' / 'block1.*' (PVT) nor 'layers.0.blocks.*' "
                       f'(Swin) keys; first keys: {list(state_dict)[:5]}')
    if family is not None and family != detected:
        raise ValueError(f'checkpoint holds an official Pola-{detected.upper()} '
                         f'model, but a Pola-{family.upper()} backbone asked for it')
    rules = PVT_RULES if detected == PVT_FAMILY else SWIN_RULES
    num_swin_stages = 1 + max(
        (int(m[1]) for m in map(re.compile(r'^layers\.(\d+)\.').match, state_dict) if m),
        default=-1)

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


def refuse_same_file(src: str, dst: str) -> None:
    """Raise ValueError when writing ``dst`` would overwrite ``src`` (the same path, a
    symlink to it, a path through a symlinked folder, or a hard link)."""
    src_path, dst_path = osp.expanduser(src), osp.expanduser(dst)
    same = osp.realpath(src_path) == osp.realpath(dst_path)
    if not same and osp.exists(src_path) and osp.exists(dst_path):
        same = osp.samefile(src_path, dst_path)
    if same:
        raise ValueError(f'DST {dst!r} is the source file {src!r}: the converter would '
                         'overwrite the official checkpoint; choose another DST')


def convert_official_checkpoint(src: str, dst: str) -> Dict[str, torch.Tensor]:
    """Read an official checkpoint and write ``{'state_dict', 'meta'}`` for mm*.

    Args:
        src (str): the official file (local path, URL or another mmengine scheme).
        dst (str): the local output file; never ``src`` itself, nor a directory.
            Written atomically (a temporary file next to it, renamed when complete).

    Returns:
        dict: the converted state dict.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    refuse_same_file(src, dst)
    if osp.isdir(osp.expanduser(dst)):
        raise ValueError(f'DST {dst!r} is an existing directory: give the path of the file '
                         f'to write, e.g. {osp.join(dst, "converted.pth")!r}')
    state_dict = extract_state_dict(load_checkpoint(src, what='official checkpoint'), source=src)
    refuse_non_finite(state_dict, src, 'official2mm.py')
    family = detect_official_family(state_dict)
    converted = convert_official_state_dict(state_dict)
    meta = dict(
        source=osp.basename(src),
        backbone='PolaPVT' if family == PVT_FAMILY else 'PolaSwin',
        converted_by=f'polaformer_mm {__version__}')
    atomic_save(dict(state_dict=converted, meta=meta), dst)
    return converted


def load_backbone_weights(checkpoint: str,
                          family: str,
                          prefix: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """Backbone state dict from a converted file (prefix stripped; without a prefix,
    'backbone.' is stripped when present), a bare backbone state dict, an official
    checkpoint (converted on the fly), or a release file the family reads in its own way
    (``BackboneFamily.read_release``)."""
    if not checkpoint:
        raise ValueError("init_cfg type='Pretrained' needs a 'checkpoint' path")
    try:
        obj = load_checkpoint(checkpoint, what='init_cfg checkpoint')
    except OSError as err:
        if isinstance(err, FileNotFoundError) or is_local_checkpoint(checkpoint):
            raise
        raise RuntimeError(
            f'init_cfg checkpoint {checkpoint!r} could not be fetched ({err}); if it comes '
            "from a base config's model.pretrained (e.g. an mmseg ResNet), set "
            'pretrained=None') from err
    state_dict = extract_state_dict(obj, source=checkpoint)
    read_release = None if family is None else family_named(family).read_release
    released = None if read_release is None else read_release(state_dict)
    if released is not None:
        refuse_non_finite(state_dict, checkpoint, "init_cfg type='Pretrained'")
        return released
    if detect_official_family(state_dict) is not None:
        state_dict = convert_official_state_dict(state_dict, family=family)
        prefix = 'backbone.'
    elif prefix is None and any(k.startswith('backbone.') for k in state_dict):
        prefix = 'backbone.'  # a whole-model checkpoint (ours, or mmdet/mmseg/mmpretrain)
    if prefix:
        stripped = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if not stripped:
            raise KeyError(f'no key of {checkpoint!r} starts with prefix {prefix!r}; '
                           f'first keys: {list(state_dict)[:5]}')
        state_dict = stripped
    refuse_non_finite(state_dict, checkpoint, "init_cfg type='Pretrained'", prefix or '')
    return state_dict
