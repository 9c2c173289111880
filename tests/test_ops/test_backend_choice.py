"""Choosing the op's backend without code: ``POLA_ATTENTION_BACKEND`` and a config's
``PolaAttentionBackendHook`` (restored after a run, a failed one included with PolaRunner, and
after a run inside a run; one hook per runner)."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

import polaformer_mm  # noqa: F401  (registers the hook)
from polaformer_mm.ops import pola_attention

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEG = os.path.join(REPO, 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py')


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


@HOOKS.register_module(force=True)
class _FailingHookOfTestBackendChoice(Hook):
    """Records the default backend at the first training iteration, then fails the run."""
    seen = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        """Fail the run, as any error inside training would."""
        self.seen.append(pola_attention._default_backend)
        raise RuntimeError('a run that fails')


def test_a_failed_run_restores_the_default_and_removes_the_guard_hooks(
        synthetic_data_root, tmp_path):
    """PolaRunner (tools/train.py's runner) on a config with the hook: the run fails at its
    first iteration; the default backend is the one from before the run, and the
    divergence guard left no hook on the model's attention modules."""
    from polaformer_mm.engine import entry
    from polaformer_mm.models.attention import PolaLinearAttention
    cfg = entry.load_config(SEG)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = synthetic_data_root
    cfg.custom_hooks = [
        dict(type='PolaAttentionBackendHook', backend='torch'),
        dict(type='_FailingHookOfTestBackendChoice')
    ]
    entry.prepare_train_config(cfg, SEG, work_dir=str(tmp_path))
    previous = pola_attention.set_default_backend('auto')
    _FailingHookOfTestBackendChoice.seen.clear()
    try:
        runner = entry.build_runner(cfg)
        with pytest.raises(RuntimeError, match='a run that fails'):
            runner.train()
        assert _FailingHookOfTestBackendChoice.seen == ['torch']
        assert pola_attention._default_backend == 'auto'
        attention = [m for m in runner.model.modules() if isinstance(m, PolaLinearAttention)]
        assert attention and not any(m._forward_pre_hooks for m in attention)
    finally:
        pola_attention.set_default_backend(previous)


def test_two_hooks_are_an_error_before_either_sets_anything():
    hooks = [
        HOOKS.build(dict(type='PolaAttentionBackendHook', backend=b)) for b in ('torch', 'triton')
    ]
    runner = SimpleNamespace(hooks=hooks)
    previous = pola_attention.set_default_backend('auto')
    try:
        with pytest.raises(
                ValueError,
                match=r"custom_hooks holds 2 PolaAttentionBackendHook \(backend='torch', "
                r"backend='triton'\).*keep one"):
            hooks[0].before_run(runner)
        assert pola_attention._default_backend == 'auto'
    finally:
        pola_attention.set_default_backend(previous)


def test_a_run_inside_a_run_keeps_the_outer_default():
    """Validation called inside training (before_run twice): the default after the outer
    run is the one from before it."""
    hook = HOOKS.build(dict(type='PolaAttentionBackendHook', backend='torch'))
    previous = pola_attention.set_default_backend('triton')
    try:
        hook.before_run(runner=None)
        hook.before_run(runner=None)
        hook.after_run(runner=None)
        assert pola_attention._default_backend == 'torch'
        hook.after_run(runner=None)
        assert pola_attention._default_backend == 'triton'
    finally:
        pola_attention.set_default_backend(previous)
