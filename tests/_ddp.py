"""State dicts as a ``DistributedDataParallel`` model saves them (keys ``module.*``).

A one-process gloo group (a file store in a temporary folder) is created for the wrap and
destroyed right after, so nothing else in the test process sees a distributed run.
"""
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def ddp_state_dict(model: torch.nn.Module) -> dict:
    """``DistributedDataParallel(model).state_dict()`` (CPU, world size 1)."""
    assert not dist.is_initialized()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group('gloo', init_method=f'file://{tmp}/store', rank=0, world_size=1)
        try:
            state = DistributedDataParallel(model).state_dict()
        finally:
            dist.destroy_process_group()
    assert state and all(k.startswith('module.') for k in state), list(state)[:3]
    return state
