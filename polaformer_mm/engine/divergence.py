"""The divergence guard: a run whose loss (or gradient norm) stops being finite ends.

:class:`DivergenceGuardHook` is installed by :class:`~.runner.PolaRunner` in every
training run unless the config sets ``divergence_guard = False``. After each training
iteration it checks the loss terms the model returned and, for optimizer wrappers without
a dynamic loss scale, the gradient norm that gradient clipping measured; a value that is
not finite, or a dynamic loss scale that fell to zero, stops the run with a
:class:`TrainingDivergedError` naming the iteration, the terms, the learning rate (one
value, or the smallest and largest over the parameter groups) and the last checkpoint
written, before any checkpoint of that
iteration is written. A checkpoint about to be written with weights that are not finite
is refused the same way. An error of the Pola attention op about inputs that are not
finite, raised in training, is turned into the same error naming the layer
(:meth:`DivergenceGuardHook.explain`).
"""
import math
from typing import List, Optional

import torch
from mmengine.dist import all_reduce, get_world_size
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

#: the config key that turns the guard off (``divergence_guard = False``)
CONFIG_KEY = 'divergence_guard'


class TrainingDivergedError(RuntimeError):
    """Training produced a loss, gradient norm or weights that are not finite."""


def non_finite_tensors(state_dict: dict) -> List[str]:
    """Names of the floating-point tensors of ``state_dict`` that hold a NaN or an
    infinity."""
    return [
        name for name, t in state_dict.items()
        if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]


def describe_non_finite(names: List[str], total: int) -> str:
    """``'3 of 136 tensors (a, b, c)'``: at most three names."""
    more = ', ...' if len(names) > 3 else ''
    return f'{len(names)} of {total} tensors ({", ".join(names[:3])}{more})'


def _is_finite(value) -> bool:
    if torch.is_tensor(value):
        return bool(torch.isfinite(value.detach()).all())
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True  # not a number: nothing to check


def _format(value) -> str:
    if torch.is_tensor(value):
        value = value.detach().float().mean().item() if value.numel() else float('nan')
    try:
        return f'{float(value):.6g}'
    except (TypeError, ValueError):
        return repr(value)


def summarise_lrs(lrs: dict) -> str:
    """The learning rates of ``OptimWrapper.get_lr()`` in a few words: one value per
    key where all its parameter groups share it, else the smallest and largest and the
    number of groups (a model with many groups, e.g. Mask2Former's, would otherwise fill
    kilobytes)."""
    parts = []
    for key, values in lrs.items():
        values = [float(v) for v in (values if isinstance(values, (list, tuple)) else [values])]
        if not values:
            continue
        low, high = min(values), max(values)
        groups = f' ({len(values)} parameter groups)' if len(values) > 1 else ''
        if low == high:
            parts.append(f'{key}={low:.6g}{groups}')
        else:
            parts.append(f'{key} from {low:.6g} to {high:.6g}{groups}')
    return ', '.join(parts) or 'unknown'


def loss_scales(optim_wrapper) -> List[float]:
    """The current scales of the dynamic loss scalers (``AmpOptimWrapper``) of an
    optimizer wrapper (or of every wrapper of an ``OptimWrapperDict``)."""
    wrappers = getattr(optim_wrapper, 'optim_wrappers', None)
    if isinstance(wrappers, dict):
        return [s for w in wrappers.values() for s in loss_scales(w)]
    scaler = getattr(optim_wrapper, 'loss_scaler', None)
    if scaler is None or not hasattr(scaler, 'get_scale'):
        return []
    return [float(scaler.get_scale())]


def _has_loss_scale(optim_wrapper) -> bool:
    """Whether an optimizer wrapper skips steps with non-finite gradients itself
    (``AmpOptimWrapper``'s dynamic loss scale)."""
    wrappers = getattr(optim_wrapper, 'optim_wrappers', None)
    if isinstance(wrappers, dict):
        return any(_has_loss_scale(w) for w in wrappers.values())
    return getattr(optim_wrapper, 'loss_scaler', None) is not None


@HOOKS.register_module()
class DivergenceGuardHook(Hook):
    """Stops training at the first iteration whose loss (or gradient norm) is not finite.

    See the module docstring. Runs before the checkpoint and logger hooks, so the
    iteration that diverged is neither saved nor needs to be read from a log.
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self) -> None:
        self._layer: Optional[str] = None
        self._handles = []
        self._last_good: Optional[str] = None  # the last checkpoint known to be complete

    # -- which Pola attention layer runs (named in the op's non-finite error) ---------
    def before_train(self, runner) -> None:
        """Remember, while training, which Pola attention layer is running."""
        from ..models.attention import PolaLinearAttention
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        for name, module in model.named_modules():
            if isinstance(module, PolaLinearAttention):
                self._handles.append(module.register_forward_pre_hook(self._entering(name)))

    def _entering(self, name: str):

        def hook(module, args):
            self._layer = name

        return hook

    def after_train(self, runner) -> None:
        """Remove the layer-tracking hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def after_failed_run(self, runner) -> None:
        """Remove the layer-tracking hooks of a run that raised (a diverged one among
        them), which ``after_train`` would have removed (:class:`~.runner.PolaRunner`
        calls this)."""
        self.after_train(runner)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        """No layer is running yet; the checkpoints written so far are complete."""
        self._layer = None
        self._last_good = runner.message_hub.get_info('last_ckpt')

    # -- the checks ----------------------------------------------------------------
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        """Stop when a loss term or the gradient norm is not finite."""
        bad = [(k, v) for k, v in (outputs or {}).items() if not _is_finite(v)]
        hub = runner.message_hub
        if not _has_loss_scale(runner.optim_wrapper) and 'train/grad_norm' in hub.log_scalars:
            grad_norm = hub.get_scalar('train/grad_norm').current()
            if not _is_finite(grad_norm):
                bad.append(('grad_norm', grad_norm))
        collapsed = [s for s in loss_scales(runner.optim_wrapper) if not s > 0 or math.isinf(s)]
        if get_world_size() > 1:  # every rank stops together, none waits for the others
            flag = torch.tensor([float(bool(bad or collapsed))])
            all_reduce(flag, op='max')
            if flag.item() and not (bad or collapsed):
                bad = [('(on another process)', float('nan'))]
        problems = []
        if bad:
            problems.append('not finite: ' + ', '.join(f'{k}={_format(v)}' for k, v in bad))
        if collapsed:  # zero: every step since has been skipped; no update is possible
            problems.append(
                f'the dynamic loss scale fell to {collapsed[0]:g} (AmpOptimWrapper halves it '
                'at every step whose gradients overflow; at 0 every gradient is zero or NaN '
                'and no step updates the weights)')
        if problems:
            raise TrainingDivergedError(
                self.message(runner, '; '.join(problems), iteration=runner.iter + 1))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Refuse to write a checkpoint whose weights are not finite."""
        state = checkpoint.get('state_dict', {})
        bad = non_finite_tensors(state)
        if bad:
            raise TrainingDivergedError(
                self.message(
                    runner,
                    f'the weights are not finite: {describe_non_finite(bad, len(state))}',
                    iteration=runner.iter))

    # -- the message ---------------------------------------------------------------
    def message(self, runner, what: str, iteration: int) -> str:
        """The one message of a run that diverged at ``iteration`` (1-based)."""
        try:
            lr = summarise_lrs(runner.optim_wrapper.get_lr())
        except Exception:  # an optimizer wrapper without get_lr
            lr = 'unknown'
        last = self._last_good
        ckpt = (f'the last checkpoint written is {last} (to resume from it with a lower '
                f'learning rate: --resume {last} --cfg-options optim_wrapper.optimizer.lr=LR '
                'resume_optimizer_from=config)' if last else 'no checkpoint has been written yet')
        epoch = '' if hasattr(runner.train_loop, 'dataloader_iterator') else \
            f' (epoch {runner.epoch + 1})'
        return (f'training diverged at iteration {iteration}{epoch}: '
                f'{what}; learning rate {lr}; {ckpt}. No checkpoint of these weights is '
                f'written. To train on regardless, set {CONFIG_KEY} = False in the config '
                f'(--cfg-options {CONFIG_KEY}=False).')

    def explain(self, runner, err: Exception) -> Optional[TrainingDivergedError]:
        """The divergence error for an error of the Pola attention op about inputs that
        are not finite, raised in training (None for any other error)."""
        text = str(err)
        if not (isinstance(err, ValueError) and text.startswith('pola_linear_attention:')
                and 'finite' in text and self._layer is not None):
            return None
        what = (f'the inputs of the Pola attention layer {self._layer} are not finite '
                f'(the weights or the features before it hold NaN or infinity: {text})')
        return TrainingDivergedError(self.message(runner, what, iteration=runner.iter + 1))
