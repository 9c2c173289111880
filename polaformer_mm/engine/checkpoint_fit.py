"""Does a checkpoint fit a model? A strict check whose error says why not.

mmengine's ``Runner.load_checkpoint`` loads non-strictly by default: a checkpoint of
another model (a ResNet state dict, a segmentor's weights for a detector, a
backbone-only file) loads nothing or a part, a warning goes to the log, and evaluation
scores random weights. :class:`~.runner.PolaRunner` calls :func:`check_checkpoint_fits`
before it loads (``load_from``, ``--resume``, test checkpoints) unless partial loading is
allowed, and so does ``tools/demo/image_demo.py`` for ``--weights``; the error names the
keys and the likely cause.
"""
import re
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch.nn as nn
from mmengine.model import BaseTTAModel, is_model_wrapper

from ..models.official_weights import detect_official_family

PARTIAL_HINT = ('To load only what fits, pass --allow-partial to tools/train.py, '
                'tools/test.py or tools/demo/image_demo.py, or set allow_partial_load = True '
                'in the config.')
_TASK_HEADS = (
    ('segmentation', ('decode_head', 'auxiliary_head')),
    ('detection', ('rpn_head', 'roi_head', 'bbox_head', 'mask_head')),
    ('classification', ('head', )),
)
_SHOWN = 8  # keys shown per list


class CheckpointMismatchError(ValueError):
    """A checkpoint whose keys or shapes do not fit the model it is loaded into."""


def _task(top_level: Sequence[str]) -> Optional[str]:
    for task, heads in _TASK_HEADS:
        if any(h in top_level for h in heads):
            return task
    return None


def _top(keys) -> List[str]:
    return list(OrderedDict.fromkeys(k.split('.', 1)[0] for k in keys))


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP-style wrappers and test-time-augmentation models, as
    mmengine's ``load_state_dict`` sees it."""
    while is_model_wrapper(model) or isinstance(model, BaseTTAModel):
        model = model.module
    return model


def checkpoint_state_dict(checkpoint, revise_keys=((r'^module\.', ''), )) -> Dict:
    """The state dict of ``checkpoint`` with ``revise_keys`` applied, as mmengine's
    ``_load_checkpoint_to_model`` takes it."""
    state_dict = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint,
                                                                        dict) else checkpoint
    if not isinstance(state_dict, dict):
        raise CheckpointMismatchError(
            f'expected a dict of tensors (or one under \'state_dict\'), got '
            f'{type(state_dict).__name__}')
    for pattern, replacement in revise_keys:
        state_dict = OrderedDict(
            (re.sub(pattern, replacement, k), v) for k, v in state_dict.items())
    return state_dict


def find_mismatch(model: nn.Module,
                  state_dict: Dict) -> Tuple[List[str], List[str], List[Tuple[str, tuple, tuple]]]:
    """(missing, unexpected, shape mismatches) of ``state_dict`` against ``model``.
    BatchNorm's ``num_batches_tracked`` may be missing (as mmengine allows), and the keys a
    module lists in its ``optional_state_keys`` (records such as a backbone's patch grid, which
    its loading reads) may be missing or extra."""
    inner = unwrap(model)
    own = inner.state_dict()
    optional = {
        f'{name}.{key}' if name else key
        for name, module in inner.named_modules()
        for key in getattr(module, 'optional_state_keys', ())
    }
    missing = [
        k for k in own
        if k not in state_dict and 'num_batches_tracked' not in k and k not in optional
    ]
    unexpected = [k for k in state_dict if k not in own and k not in optional]
    shapes = [(k, tuple(getattr(v, 'shape', ())), tuple(own[k].shape))
              for k, v in state_dict.items()
              if k in own and tuple(getattr(v, 'shape', ())) != tuple(own[k].shape)]
    return missing, unexpected, shapes


def likely_cause(model_keys: Sequence[str],
                 missing: Sequence[str],
                 unexpected: Sequence[str],
                 shapes: Sequence[tuple],
                 ckpt_keys: Sequence[str],
                 nested_keys: Sequence[str] = ()) -> str:
    """One sentence on what the checkpoint probably is (``nested_keys``: the keys of a
    state dict under ``'model'``, where official files keep it)."""
    model_top, ckpt_top = _top(model_keys), _top(ckpt_keys)
    matched = set(model_keys) & set(ckpt_keys)
    backbone_keys = [k for k in model_keys if k.startswith('backbone.')]
    backbone_only_hint = ("load it through model.backbone.init_cfg=dict(type='Pretrained', "
                          'checkpoint=...) and keep load_from for whole-model checkpoints')
    if not matched:
        prefixed = {'backbone.' + k for k in ckpt_keys}
        if backbone_keys and len(prefixed & set(backbone_keys)) >= len(backbone_keys) / 2:
            return f'a backbone-only file (keys without the backbone. prefix): ' \
                   f'{backbone_only_hint}'
        if detect_official_family(ckpt_keys) is not None or (
                nested_keys and detect_official_family(nested_keys) is not None):
            return ('an official PolaFormer (ImageNet) checkpoint: convert it with '
                    'tools/model_converters/official2mm.py and give it to the backbone '
                    "with model.backbone.init_cfg=dict(type='Pretrained', checkpoint=...)")
        return ('no key matches: a checkpoint of another architecture (checkpoint keys '
                f'start with {ckpt_top[:5]}, the model\'s with {model_top[:5]})')
    ckpt_task, model_task = _task(ckpt_top), _task(model_top)
    if ckpt_task and model_task and ckpt_task != model_task:
        heads = dict(_TASK_HEADS)
        ckpt_heads = [t for t in ckpt_top if t in heads[ckpt_task]]
        model_heads = [t for t in model_top if t in heads[model_task]]
        return (f'a {ckpt_task} checkpoint ({", ".join(ckpt_heads)}) for a {model_task} '
                f'model ({", ".join(model_heads)})')
    if backbone_keys and set(backbone_keys) <= set(ckpt_keys) and all(
            not k.startswith('backbone.')
            for k in missing) and not shapes and set(_top(unexpected)) <= {'head'}:
        return f'a backbone-only file (e.g. converted ImageNet weights): {backbone_only_hint}'
    if shapes and not missing and not unexpected:
        if all(not k.startswith('backbone.') for k, _, _ in shapes):
            return ('the same architecture with other head sizes (another number of '
                    'classes?)')
        return 'the same architecture in another size (another arch or width?)'
    only_ckpt = [t for t in ckpt_top if t not in model_top]
    only_model = [t for t in model_top if t not in ckpt_top]
    if only_ckpt or only_model:
        return (f'another model: modules only in the checkpoint {only_ckpt}, only in '
                f'the model {only_model}')
    parts = _top(missing + unexpected + [k for k, _, _ in shapes])
    return f'another configuration of the same model (it differs in {parts})'


def _listing(title: str, items: Sequence[str]) -> str:
    per_module = OrderedDict()
    for item in items:
        top = item.split('.', 1)[0]
        per_module[top] = per_module.get(top, 0) + 1
    where = ', '.join(f'{top} {n}' for top, n in per_module.items())
    shown = ', '.join(items[:_SHOWN])
    more = f', ... ({len(items) - _SHOWN} more)' if len(items) > _SHOWN else ''
    return f'\n  {title} ({len(items)}; {where}): {shown}{more}'


def describe_mismatch(model: nn.Module, state_dict: Dict, source: str) -> Optional[str]:
    """None when ``state_dict`` fits ``model`` exactly, else a message naming the keys
    and the likely cause."""
    missing, unexpected, shapes = find_mismatch(model, state_dict)
    if not (missing or unexpected or shapes):
        return None
    model_keys = list(unwrap(model).state_dict())
    nested = state_dict.get('model')
    cause = likely_cause(model_keys, missing, unexpected, shapes, list(state_dict),
                         list(nested) if isinstance(nested, dict) else ())
    counts = ', '.join(f'{n} {what}'
                       for n, what in ((len(missing), 'missing keys'), (len(unexpected),
                                                                        'unexpected keys'),
                                       (len(shapes), 'shape mismatches')) if n)
    text = (f'{source} does not fit the model ({type(unwrap(model)).__name__}): {counts}.'
            f'\nLikely cause: {cause}.')
    if missing:
        text += _listing('missing keys', missing)
    if unexpected:
        text += _listing('unexpected keys', unexpected)
    if shapes:
        text += _listing('shape mismatches',
                         [f'{k}: checkpoint {list(a)} vs model {list(b)}' for k, a, b in shapes])
    return text


def check_checkpoint_fits(model: nn.Module,
                          checkpoint,
                          source: str = 'checkpoint',
                          revise_keys=((r'^module\.', ''), )) -> None:
    """Raise :class:`CheckpointMismatchError` unless ``checkpoint`` fits ``model``
    exactly (every key present, none extra, every shape equal).

    Args:
        model (nn.Module): the model (wrappers and TTA models are looked through).
        checkpoint (dict): a checkpoint (``{'state_dict': ...}``) or a state dict.
        source (str): how the message names the checkpoint. Default: 'checkpoint'.
        revise_keys (sequence): (pattern, replacement) pairs applied to the keys first,
            as ``Runner.load_checkpoint`` applies them. Default: strip ``module.``.
    """
    message = describe_mismatch(model, checkpoint_state_dict(checkpoint, revise_keys), source)
    if message:
        raise CheckpointMismatchError(f'{message}\n{PARTIAL_HINT}')
