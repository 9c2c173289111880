"""Checks of a built model's configuration that would otherwise fail deep inside a forward.

A neck whose ``in_channels`` differ from the channels the backbone returns builds fine
and fails at the first iteration with a convolution shape error naming neither (mmdet and
mmseg behave so). :func:`check_model_channels` compares them when the model is built
(:class:`~.runner.PolaRunner`, ``tools/demo/image_demo.py``) and names both lists and the
config keys.
"""
from typing import List, Optional

import torch.nn as nn

from ..models.backbones.base import PolaBackboneBase
from .checkpoint_fit import unwrap

__all__ = ['ModelConfigError', 'check_model_channels']


class ModelConfigError(ValueError):
    """A model config whose parts do not fit together."""


def _first(module: Optional[nn.Module]) -> Optional[nn.Module]:
    """A neck given as a list is built as ``nn.Sequential``: its first part takes the
    backbone's maps."""
    if isinstance(module, nn.Sequential) and len(module):
        return module[0]
    return module


def _channel_list(value) -> Optional[List[int]]:
    if isinstance(value, (list, tuple)) and all(isinstance(c, int) for c in value):
        return list(value)
    return None


def _backbone_text(backbone: PolaBackboneBase) -> str:
    return (f'model.backbone ({type(backbone).__name__} with out_indices='
            f'{tuple(backbone.out_indices)})')


def _check_neck(backbone: PolaBackboneBase, neck: nn.Module, out: List[int]) -> None:
    wanted = _channel_list(getattr(neck, 'in_channels', None))
    if wanted is None or wanted == out:
        return  # a neck without a channel list (e.g. global pooling) takes any
    raise ModelConfigError(
        f'model.neck.in_channels={wanted} ({type(neck).__name__}) does not match the '
        f'channels {out} of the maps that {_backbone_text(backbone)} returns: set '
        f'model.neck.in_channels={out} or change model.backbone.out_indices')


def _check_head(backbone: PolaBackboneBase, key: str, head: nn.Module, out: List[int]) -> None:
    """A segmentation head reading the backbone's maps by ``in_index``."""
    in_channels, in_index = getattr(head, 'in_channels', None), getattr(head, 'in_index', None)
    transform = getattr(head, 'input_transform', None)
    if transform is None and isinstance(in_channels, int) and isinstance(in_index, int):
        many, indices, wanted = False, [in_index], [in_channels]
    elif transform == 'multiple_select' and _channel_list(in_channels) is not None \
            and _channel_list(in_index) is not None:
        many, indices, wanted = True, list(in_index), list(in_channels)
    else:  # 'resize_concat' keeps only the sum of the channels
        return
    bad = [i for i in indices if not -len(out) <= i < len(out)]
    if bad:
        raise ModelConfigError(
            f'{key}.in_index={in_index} names maps that {_backbone_text(backbone)} does not '
            f'return (it returns {len(out)} maps, channels {out})')
    got = [out[i] for i in indices]
    if wanted != got:
        value = got if many else got[0]
        raise ModelConfigError(
            f'{key}.in_channels={in_channels} ({type(head).__name__}, in_index={in_index}) '
            f'does not match the channels {value} of those maps of '
            f'{_backbone_text(backbone)} (all maps: {out}): set {key}.in_channels={value}')


def check_model_channels(model: nn.Module) -> None:
    """Raise :class:`ModelConfigError` when the part reading a Pola backbone's maps (the
    neck; without a neck, a segmentor's ``decode_head`` / ``auxiliary_head``) expects
    other channels than the backbone returns. Models with other backbones, and necks
    without a channel list, are not checked.

    Args:
        model (nn.Module): a built detector, segmentor or classifier (wrappers and
            test-time-augmentation models are looked through).
    """
    model = unwrap(model)
    backbone = getattr(model, 'backbone', None)
    if not isinstance(backbone, PolaBackboneBase):
        return
    out = backbone.out_channels
    neck = _first(getattr(model, 'neck', None))
    if neck is not None:
        _check_neck(backbone, neck, out)
        return
    for key in ('decode_head', 'auxiliary_head'):
        heads = getattr(model, key, None)
        if heads is None:
            continue
        if isinstance(heads, nn.ModuleList):
            for i, head in enumerate(heads):
                _check_head(backbone, f'model.{key}[{i}]', head, out)
        else:
            _check_head(backbone, f'model.{key}', heads, out)
