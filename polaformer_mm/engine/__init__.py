from .checkpoint_io import restore_runner_state, runner_checkpoint_globals, to_weights_only_safe
from .hooks import ResumableStateHook
from .runner import PolaRunner

__all__ = ['PolaRunner', 'ResumableStateHook', 'runner_checkpoint_globals',
           'to_weights_only_safe', 'restore_runner_state']
