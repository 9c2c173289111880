"""Choosing the op's backend without code: ``POLA_ATTENTION_BACKEND`` and a config's
``PolaAttentionBackendHook``."""
import os
import subprocess
import sys

import pytest
import torch
from mmengine.registry import HOOKS

import polaformer_mm  # noqa: F401  (registers the hook)
from polaformer_mm.ops import pola_attention

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _default_backend_in_a_fresh_process(value):
    env = dict(os.environ, POLA_ATTENTION_BACKEND=value)
    code = ('from polaformer_mm.ops import pola_attention as op; '
            'print(op.set_default_backend("auto"))')
    return subprocess.run([sys.executable, '-c', code],
                          cwd=REPO,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize('value, expected', [('torch', 'torch'), ('Triton', 'triton'),
                                             ('', 'auto')])
def test_the_environment_sets_the_default_backend(value, expected):
    proc = _default_backend_in_a_fresh_process(value)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == expected


@pytest.mark.slow
def test_a_wrong_environment_value_is_named():
    proc = _default_backend_in_a_fresh_process('cuda')
    assert proc.returncode != 0
    assert "POLA_ATTENTION_BACKEND='cuda'" in proc.stderr and 'auto, torch, triton' in proc.stderr


def test_the_config_hook_sets_the_backend_for_the_run_and_restores_it():
    hook = HOOKS.build(dict(type='PolaAttentionBackendHook', backend='torch'))
    previous = pola_attention.set_default_backend('triton')
    try:
        hook.before_run(runner=None)
        assert pola_attention._default_backend == 'torch'
        # the op takes the torch path without being told: a forced 'triton' on CPU tensors
        # would raise, naming that the kernels need CUDA tensors
        q = torch.randn(1, 1, 5, 8)
        out = pola_attention.pola_linear_attention(q, q, q, torch.zeros(1, 1, 1, 8))
        assert out.shape == q.shape
        hook.after_run(runner=None)
        assert pola_attention._default_backend == 'triton'
    finally:
        pola_attention.set_default_backend(previous)


def test_the_hook_names_a_wrong_backend():
    with pytest.raises(ValueError, match="backend='cuda'.*auto, torch, triton"):
        HOOKS.build(dict(type='PolaAttentionBackendHook', backend='cuda'))
