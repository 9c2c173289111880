"""Marks for tests that need a CUDA GPU (``pytest -m cuda`` selects them).

Usage: ``pytestmark = CUDA`` at module level, or ``@cuda_test`` on a test. Without a
visible GPU the tests are collected and skipped with the reason.
"""
import pytest
import torch

NO_CUDA_REASON = 'needs a CUDA GPU (torch.cuda.is_available() is False)'

#: Both marks: ``cuda`` (for ``-m cuda``) and the skip when no GPU is visible.
CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA_REASON)]


def cuda_test(fn):
    """Decorator form of :data:`CUDA`."""
    for mark in reversed(CUDA):
        fn = mark(fn)
    return fn
