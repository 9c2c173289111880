"""Device parametrization for tests that run on CUDA at full size and on the CPU small.

``DEVICES`` gives each test a ``cpu`` case (small inputs, float32: the code path is
exercised everywhere) and a ``cuda`` case, marked ``cuda`` (``pytest -m cuda`` selects
the GPU tests) and skipped with the reason below where torch sees no GPU.
"""
import pytest
import torch

CUDA_AVAILABLE = torch.cuda.is_available()
NO_CUDA_REASON = (f'needs a CUDA GPU: torch.cuda.is_available() is False (torch '
                  f'{torch.__version__}, built for CUDA {torch.version.cuda})')

cuda_only = [pytest.mark.cuda, pytest.mark.skipif(not CUDA_AVAILABLE, reason=NO_CUDA_REASON)]


def cuda_param(*values, id=None):
    """A parameter set that runs on CUDA only."""
    return pytest.param(*values, id=id, marks=cuda_only)


DEVICES = [pytest.param('cpu', id='cpu'), cuda_param('cuda', id='cuda')]
