"""Resume without surprises: the optimizer of the config against the checkpoint's, and
``last_checkpoint`` of a copied or moved work dir.

* :func:`compare_optimizer`: a resumed run continues with the checkpoint's optimizer state
  and hyperparameters (mmengine restores them over the config's). A learning rate or
  weight decay of the config that differs from the checkpoint's is reported in one
  message saying which wins and how to make the other win; an optimizer of another type
  (its state lacks hyperparameters the config's optimizer needs) is a
  :class:`~polaformer_mm.utils.checkpoint_io.CheckpointError` instead of a ``KeyError``
  from torch in the first step.
* :func:`latest_checkpoint`: ``last_checkpoint`` holds an absolute path; when that path is
  not inside the work dir (the work dir was copied or moved), the checkpoint of the same
  name inside the work dir is resumed.
"""
import os
import os.path as osp
from typing import List, Optional, Tuple

from ..utils.checkpoint_io import CheckpointError

#: the config key that makes a resumed run take the config's lr and weight decay
CONFIG_KEY = 'resume_optimizer_from'
_CHOICES = ('checkpoint', 'config')

# hyperparameters that tell optimizers apart (flags such as foreach / maximize / fused,
# which torch fills in for a state that lacks them, are left out)
_DISTINCT = ('momentum', 'dampening', 'nesterov', 'betas', 'amsgrad', 'alpha', 'centered',
             'lr_decay', 'initial_accumulator_value', 'rho', 'lambd', 't0', 'etas', 'step_sizes',
             'momentum_decay')
_COMPARED = ('lr', 'weight_decay')


def optimizer_of(optim_wrapper):
    """The torch optimizer of a (single) optimizer wrapper; None for several."""
    return getattr(optim_wrapper, 'optimizer', None)


def _base(group: dict, key: str):
    # param schedulers keep the configured value under initial_<key> and change <key>
    return group.get(f'initial_{key}', group.get(key))


def _type_mismatch(name: str, saved_type: Optional[str], current: dict, saved: dict,
                   filename: str) -> Optional[str]:
    want = sorted(k for k in _DISTINCT if k in current and k not in saved)
    extra = sorted(k for k in _DISTINCT if k in saved and k not in current)
    if not (want or extra or (saved_type and saved_type != name)):
        return None
    saved_name = saved_type or (f'an optimizer with {", ".join(extra)}'
                                if extra else 'another optimizer')
    needs = (f" (the config's optimizer needs {', '.join(want)}, which that state lacks)"
             if want else '')
    back = saved_type or "the checkpoint's optimizer"
    return (f'--resume {filename}: the config trains with optim_wrapper.optimizer.type={name} '
            f'but the checkpoint holds the state of {saved_name}{needs}; a run cannot continue '
            f"with another optimizer. To train with {name} from the checkpoint's weights, start "
            f'a new run from them: --cfg-options load_from={filename} without --resume (the '
            'optimizer state and the schedule start over); to resume, set '
            f'optim_wrapper.optimizer.type back to {back}')


def compare_optimizer(optim_wrapper, checkpoint: dict, filename: str) -> Tuple[List[str], str]:
    """Compare the config's optimizer with the one whose state ``checkpoint`` holds.

    Returns:
        (differences, type name): ``'lr 1e-06 (config) / 0.001 (checkpoint)'`` per
        hyperparameter that differs in some parameter group (first such group), and
        the config's optimizer type.

    Raises:
        CheckpointError: the checkpoint holds the state of another optimizer type or
            another number of parameter groups.
    """
    optimizer = optimizer_of(optim_wrapper)
    state = checkpoint.get('optimizer')
    if optimizer is None or not isinstance(state, dict) or 'param_groups' not in state:
        return [], ''
    name = type(optimizer).__name__
    meta = checkpoint.get('meta') if isinstance(checkpoint.get('meta'), dict) else {}
    groups, saved_groups = optimizer.param_groups, state['param_groups']
    if saved_groups:
        error = _type_mismatch(name, meta.get('optimizer_type'), groups[0], saved_groups[0],
                               filename)
        if error:
            raise CheckpointError(error)
    if len(groups) != len(saved_groups):
        raise CheckpointError(
            f'--resume {filename}: the config\'s optimizer has {len(groups)} parameter groups, '
            f'the checkpoint\'s {len(saved_groups)} (optim_wrapper.paramwise_cfg or the model '
            'changed); a run cannot continue so. Start a new run from the checkpoint\'s '
            f'weights: --cfg-options load_from={filename} without --resume')
    differences = []
    for key in _COMPARED:
        for group, saved in zip(groups, saved_groups):
            ours, theirs = _base(group, key), _base(saved, key)
            if ours is not None and theirs is not None and ours != theirs:
                differences.append(f'{key} {ours:g} (config) / {theirs:g} (checkpoint)')
                break
    return differences, name


def difference_message(differences: List[str], filename: str, winner: str) -> str:
    """The one message about hyperparameters of the config that differ from the
    checkpoint's; ``winner`` is ``'checkpoint'`` or ``'config'``."""
    what = ', '.join(differences)
    if winner == 'config':
        return (f'--resume {filename}: {what}. The config\'s values are used ({CONFIG_KEY}='
                "'config'), scaled by where the schedule stands; the optimizer state (e.g. "
                f"momentum) is the checkpoint's. For the checkpoint's values, leave out "
                f"{CONFIG_KEY} (default 'checkpoint').")
    return (f'--resume {filename}: {what}. The checkpoint\'s values are used: a resumed run '
            'continues the run it resumes, optimizer state and schedule included. For the '
            f"config's values, add --cfg-options {CONFIG_KEY}=config (the schedule goes on "
            'from where it stands, scaled to them), or start a new run from the weights with '
            f'--cfg-options load_from={filename} without --resume.')


def resume_winner(cfg) -> str:
    """The config's ``resume_optimizer_from`` (``'checkpoint'`` when absent), checked."""
    winner = cfg.get(CONFIG_KEY, 'checkpoint')
    if winner not in _CHOICES:
        raise ValueError(f'{CONFIG_KEY}={winner!r}: expected one of {_CHOICES}')
    return winner


def apply_config_values(optim_wrapper, param_schedulers, config_groups: List[dict]) -> None:
    """After a resume, give the optimizer the config's lr and weight decay
    (``config_groups``: the values of each parameter group before the resume), scaling
    the schedules of these values by the same factor so they go on from where they stand.
    """
    optimizer = optimizer_of(optim_wrapper)
    schedulers = param_schedulers or []
    if isinstance(schedulers, dict):  # one list per optimizer
        schedulers = [s for v in schedulers.values() for s in v]
    for key in _COMPARED:
        for i, (group, wanted) in enumerate(zip(optimizer.param_groups, config_groups)):
            now, target = _base(group, key), wanted.get(key)
            if now is None or target is None or now == target:
                continue
            ratio = target / now if now else None
            group[key] = group[key] * ratio if ratio is not None else target
            if f'initial_{key}' in group:
                group[f'initial_{key}'] = target
            for s in schedulers:
                if getattr(s, 'param_name', None) == key and ratio is not None:
                    s.base_values[i] *= ratio
                    if getattr(s, '_last_value', None):
                        s._last_value[i] *= ratio


def config_values(optim_wrapper) -> List[dict]:
    """The configured lr and weight decay of each parameter group (before a resume)."""
    optimizer = optimizer_of(optim_wrapper)
    if optimizer is None:
        return []
    return [{k: _base(g, k) for k in _COMPARED} for g in optimizer.param_groups]


def latest_checkpoint(work_dir: str) -> Tuple[Optional[str], Optional[str]]:
    """The checkpoint ``<work_dir>/last_checkpoint`` names, read inside ``work_dir``.

    Returns:
        (path, note): the path to resume from (None when there is no ``last_checkpoint``)
        and a note when the named path was outside the work dir and its copy inside it
        is resumed instead (None otherwise).

    Raises:
        CheckpointError: the named checkpoint exists neither where it is named nor in
            the work dir.
    """
    record = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(record):
        return None, None
    with open(record) as f:
        named = f.read().strip()
    if not named:
        return None, None
    root = osp.realpath(work_dir)
    full = named if osp.isabs(named) else osp.join(work_dir, named)
    if osp.realpath(full).startswith(root + os.sep) and osp.isfile(full):
        return full, None
    parts = [p for p in named.replace('\\', '/').split('/') if p]
    for i in range(len(parts)):  # the longest tail of the named path inside the work dir
        candidate = osp.join(work_dir, *parts[i:])
        if osp.isfile(candidate):
            return candidate, (f'{record} names {named}, which is not in this work dir (it '
                               f'was copied or moved): resuming from {candidate}')
    if osp.isfile(full):
        return full, (f'{record} names {named}, outside this work dir, and the work dir has '
                      'no copy of it: resuming from that file')
    raise CheckpointError(f'--resume: {record} names {named}, which does not exist, and this '
                          f'work dir has no file {parts[-1] if parts else named!r} either; '
                          'pass the checkpoint to resume from: --resume CKPT')
