import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from polaformer_mm.models.utils import Mlp
from polaformer_mm.ops import blocked_mlp as module
from polaformer_mm.ops import mlp_gelu


def _params(C=6, hidden=10, C_out=5, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(hidden, C, generator=g, dtype=torch.float64)
    w2 = torch.randn(C_out, hidden, generator=g, dtype=torch.float64)
    b1 = torch.randn(hidden, generator=g, dtype=torch.float64) if bias else None
    b2 = torch.randn(C_out, generator=g, dtype=torch.float64) if bias else None
    return w1, b1, w2, b2


def _reference(x, w1, b1, w2, b2, approximate):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate=approximate), w2, b2)


@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('approximate', ['none', 'tanh'])
@pytest.mark.parametrize('block', [30, 1 << 21])
def test_values_and_gradients_are_those_of_the_modules(monkeypatch, bias, approximate, block):
    """Over blocks of 3 rows (30 hidden values) or in one block: the values and all
    gradients of linear - GELU - linear, for a non-contiguous (B, N, C) input."""
    monkeypatch.setattr(module, 'BLOCK_ELEMENTS', block)
    params = _params(bias=bias)
    x = torch.randn(2, 6, 17, dtype=torch.float64).transpose(1, 2)  # (2, 17, 6), strided
    weights = torch.randn(2, 17, 5, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (x, *params) if t is not None]
    out = mlp_gelu(*_with_none(leaves, bias), approximate=approximate)
    grads = torch.autograd.grad((out * weights).sum(), leaves)
    ref_leaves = [t.clone().requires_grad_() for t in (x, *params) if t is not None]
    ref = _reference(*_with_none(ref_leaves, bias), approximate)
    expected = torch.autograd.grad((ref * weights).sum(), ref_leaves)
    assert out.shape == (2, 17, 5)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for g, g_ref in zip(grads, expected):
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(
            mlp_gelu(*_with_none(leaves, bias)), _reference(*_with_none(ref_leaves, bias), 'none'))


def _with_none(leaves, bias):
    if bias:
        return leaves
    x, w1, w2 = leaves
    return x, w1, None, w2, None


def test_gradcheck(monkeypatch):
    monkeypatch.setattr(module, 'BLOCK_ELEMENTS', 8)
    w1, b1, w2, b2 = (t.requires_grad_() for t in _params(C=3, hidden=4, C_out=2))
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mlp_gelu, (x, w1, b1, w2, b2))


class _SavedBytes:

    def __init__(self):
        self.nbytes = 0

    def pack(self, t):
        self.nbytes += t.untyped_storage().nbytes()
        return t


def test_keeps_only_the_input_and_the_pre_activation():
    """For the backward pass: x and fc1(x) (and the weights), not GELU's output; the
    modules keep both hidden tensors."""
    M, C, hidden = 500, 8, 32
    params = [t.float().requires_grad_() for t in _params(C, hidden, C)]
    x = torch.randn(M, C)
    saved = {}
    for name, fn in (('blocked', mlp_gelu), ('modules', _reference)):
        hooks = _SavedBytes()
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, lambda t: t):
            fn(x, *params) if name == 'blocked' else fn(x, *params, 'none')
        saved[name] = hooks.nbytes
    weights = 4 * 2 * C * hidden
    assert saved['blocked'] <= 4 * M * (C + hidden) + weights, saved
    assert saved['modules'] >= 4 * M * (C + 2 * hidden), saved  # the check can fail


def test_shapes_that_do_not_chain_are_named():
    w1, b1, w2, b2 = _params(C=6, hidden=10, C_out=5)
    with pytest.raises(ValueError, match=r'x \(4, 7\).*\(10, 6\)'):
        mlp_gelu(torch.randn(4, 7, dtype=torch.float64), w1, b1, w2, b2)
    with pytest.raises(ValueError, match='do not chain'):
        mlp_gelu(torch.randn(4, 6, dtype=torch.float64), w1, b1, w2[:, :9], b2)


def test_mlp_uses_it_where_it_applies():
    """The backbones' Mlp: blocked on the CPU with GELU (training and eval, equal to its
    modules); module by module with active dropout, another activation, under a jit
    trace (so that FLOP counters see the two linear layers) or autocast."""
    torch.manual_seed(0)
    mlp = Mlp(8, 32)
    x = torch.randn(3, 40, 8)
    assert mlp._blocked(x)
    expected = mlp.fc2(mlp.act(mlp.fc1(x)))
    torch.testing.assert_close(mlp(x), expected)
    assert mlp(x).grad_fn.name() == '_BlockedMlpBackward'
    dropout = Mlp(8, 32, drop=0.5)
    assert not dropout._blocked(x)
    assert dropout.eval()._blocked(x)
    relu = Mlp(8, 32, act_cfg=dict(type='ReLU'))
    assert not relu._blocked(x)
    traced = torch.jit.trace(mlp, x)
    assert str(traced.inlined_graph).count('aten::linear') == 2
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not mlp._blocked(x)
        assert mlp(x).dtype == torch.bfloat16


def test_mlp_module_swap_keeps_state_dict():
    """The blocked path uses the modules' own parameters: state dicts are unchanged."""
    mlp = Mlp(8, 32)
    assert set(mlp.state_dict()) == {'fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias'}
    assert isinstance(mlp.act, nn.GELU)
