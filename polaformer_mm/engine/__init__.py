from .checkpoint_fit import CheckpointMismatchError, check_checkpoint_fits
from .divergence import DivergenceGuardHook, TrainingDivergedError
from .hooks import PolaAttentionBackendHook, PolaCheckpointHook, ResumableStateHook
from .runner import PolaRunner
from .runner_state import restore_runner_state, to_weights_only_safe

__all__ = [
    'PolaRunner', 'PolaCheckpointHook', 'ResumableStateHook', 'PolaAttentionBackendHook',
    'DivergenceGuardHook', 'TrainingDivergedError', 'CheckpointMismatchError',
    'check_checkpoint_fits', 'to_weights_only_safe', 'restore_runner_state'
]
