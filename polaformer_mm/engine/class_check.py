"""Heads whose ``num_classes`` disagree with the data's classes, named before a run starts.

A head predicting more or fewer classes than the dataset holds builds fine and fails deep
in the loss (``IndexError: index 2 is out of bounds``, ``Target 3 is out of bounds``) or,
with more classes than the data, only after a whole epoch in the metric.
:func:`check_num_classes` compares every head's ``num_classes`` (mmdet's
``NumClassCheckHook`` rule: RPN heads, class-agnostic, are left out) with the classes of
the datasets a run reads (the config's ``metainfo.classes``, else the dataset type's
``METAINFO``) and raises a :class:`~.model_check.ModelConfigError` naming both numbers and
both config keys. Datasets whose classes are only known once they are read (e.g.
mmpretrain's ``CustomDataset`` over class folders) are not checked.
"""
from typing import List, Optional, Sequence, Tuple

import torch.nn as nn

from .checkpoint_fit import unwrap
from .model_check import ModelConfigError

# heads with a num_classes that is not the data's (proposal heads are class-agnostic)
_SKIPPED = ('RPNHead', 'GARPNHead', 'StageCascadeRPNHead', 'CascadeRPNHead', 'FusedSemanticHead')


def _dataset_classes(cfg, split: str) -> Optional[Tuple[tuple, str]]:
    loader = cfg.get(f'{split}_dataloader')
    dataset = loader.get('dataset') if isinstance(loader, dict) else None
    key = f'{split}_dataloader.dataset'
    while isinstance(dataset, dict) and isinstance(dataset.get('dataset'), dict):
        dataset, key = dataset['dataset'], key + '.dataset'
    if not isinstance(dataset, dict):
        return None
    classes = (dataset.get('metainfo') or {}).get('classes')
    if classes is not None:
        return tuple(classes), f'{key}.metainfo.classes'
    kind = dataset.get('type')
    if not isinstance(kind, str):
        kind_cls = kind
    else:
        from mmengine.registry import DATASETS
        try:
            kind_cls = DATASETS.get(kind)
        except Exception:  # an unknown type is the dataset builder's error to raise
            return None
    classes = (getattr(kind_cls, 'METAINFO', None) or {}).get('classes')
    if not classes:
        return None
    return tuple(classes), f'{key}.type={kind_cls.__name__} (its METAINFO classes)'


def _heads(model: nn.Module) -> List[Tuple[str, int]]:
    """(config key, num_classes) of every outermost module with an int num_classes
    outside the backbone."""
    found, taken = [], []
    for name, module in unwrap(model).named_modules():
        n = getattr(module, 'num_classes', None)
        if not name or not isinstance(n, int) or isinstance(
                n, bool) or name.startswith('backbone') or any(
                    name.startswith(t + '.') for t in taken):
            continue
        taken.append(name)
        if type(module).__name__ in _SKIPPED:
            continue
        found.append((f'model.{name}.num_classes', n))
    return found


def _short(classes: Sequence) -> str:
    shown = ', '.join(repr(c) for c in classes[:4])
    return f'({shown}{", ..." if len(classes) > 4 else ""})'


def check_num_classes(model: nn.Module, cfg, splits: Sequence[str] = ('train', 'val')) -> None:
    """A :class:`~.model_check.ModelConfigError` when a head's ``num_classes`` differs
    from the number of classes of a dataset of ``splits`` (see the module docstring)."""
    heads = _heads(model)
    if not heads:
        return
    for split in splits:
        found = _dataset_classes(cfg, split)
        if found is None:
            continue
        classes, data_key = found
        wrong = [(k, n) for k, n in heads if n != len(classes)]
        if wrong:
            listed = ', '.join(f'{k}={n}' for k, n in wrong)
            keys = ' and '.join(k for k, _ in wrong)
            raise ModelConfigError(
                f'{listed} but the {split} data has {len(classes)} classes ({data_key}='
                f'{_short(classes)}): set {keys} to {len(classes)}, or give the dataset the '
                f'classes the heads predict ({data_key})')
