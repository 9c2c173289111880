import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from polaformer_mm.ops import (pola_linear_attention,
                               pola_linear_attention_reference,
                               polarity_features)


def _inputs(B=2, h=3, N=37, n=23, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, N, d, generator=g, dtype=dtype)
    k = torch.randn(B, h, n, d, generator=g, dtype=dtype)
    v = torch.randn(B, h, n, d, generator=g, dtype=dtype)
    power = torch.randn(1, h, 1, d, generator=g, dtype=dtype)
    return q, k, v, power


@pytest.mark.parametrize('shape', [
    dict(N=37, n=23, d=8),
    dict(N=16, n=16, d=16),
    dict(N=50, n=1, d=4),
    dict(N=9, n=12, d=7),  # odd head width: v splits as torch.chunk does (4 + 3)
])
@pytest.mark.parametrize('alpha', [4.0, 2.0])
def test_fast_path_matches_explicit_weights(shape, alpha):
    q, k, v, power = _inputs(**shape)
    fast = pola_linear_attention(q, k, v, power, alpha=alpha)
    ref = pola_linear_attention_reference(q, k, v, power, alpha=alpha)
    assert fast.shape == q.shape
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)


def test_gradients_match_explicit_weights():
    q, k, v, power = (t.requires_grad_() for t in _inputs(N=21, n=13, d=6))
    weights = torch.randn(q.shape, dtype=q.dtype)
    grads = []
    for fn in (pola_linear_attention, pola_linear_attention_reference):
        out = (fn(q, k, v, power) * weights).sum()
        grads.append(torch.autograd.grad(out, (q, k, v, power)))
    for g_fast, g_ref in zip(*grads):
        torch.testing.assert_close(g_fast, g_ref, rtol=1e-9, atol=1e-9)


def test_fast_path_gradcheck():
    q, k, v, power = (t.requires_grad_() for t in _inputs(B=1, h=2, N=6, n=5, d=4))
    assert torch.autograd.gradcheck(pola_linear_attention, (q, k, v, power))


def test_streams_are_what_the_method_says():
    """Same-signed stream in the first half of the head width, opposite in the rest,
    each a weighted average of its half of v (weights >= 0 summing to ~1)."""
    q, k, v, power = _inputs(N=5, n=7, d=4)
    v = torch.ones_like(v)
    out = pola_linear_attention(q, k, v, power)
    # with v == 1 every row of normalised weights sums to 1 (up to eps)
    torch.testing.assert_close(out, torch.ones_like(out), rtol=1e-4, atol=1e-4)


class _LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any operator produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_fast_path_never_forms_an_n_by_n_matrix():
    N = n = 512
    q, k, v, power = (t.requires_grad_() for t in _inputs(B=1, h=1, N=N, n=n, d=4))
    sizes = {}
    for fn in (pola_linear_attention, pola_linear_attention_reference):
        with _LargestTensor() as mode:
            fn(q, k, v, power).sum().backward()
        sizes[fn.__name__] = mode.largest
    assert sizes['pola_linear_attention_reference'] >= N * n  # the check can fail
    assert sizes['pola_linear_attention'] < N * n // 16, sizes


def test_bad_shapes_are_named():
    q, k, v, power = _inputs()
    with pytest.raises(ValueError, match=r'v shape'):
        pola_linear_attention(q, k, v[:, :, :-1], power)
    with pytest.raises(ValueError, match=r'power shape'):
        pola_linear_attention(q, k, v, power[:, :1])
    with pytest.raises(ValueError, match=r'q \(B,h,N,d\)'):
        pola_linear_attention(q[0], k, v, power)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_inputs_computed_in_float32(dtype):
    q, k, v, power = _inputs(N=64, n=32, d=8, dtype=torch.float32)
    q, k = q * 8, k * 8  # relu(q) ** 5 of these overflows float16
    expected = pola_linear_attention(q, k, v, power)
    out = pola_linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), power)
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


def test_autocast_keeps_float32_maths():
    q, k, v, power = _inputs(N=64, n=32, d=8, dtype=torch.float32)
    expected = pola_linear_attention(q, k, v, power)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = pola_linear_attention(q, k, v, power)
    torch.testing.assert_close(out, expected)


def test_polarity_features_are_relu_powers():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0], dtype=torch.float64,
                     requires_grad=True)
    p = torch.tensor(2.5, dtype=torch.float64)
    pos, neg = polarity_features(x, p)
    torch.testing.assert_close(pos, torch.relu(x)**p)
    torch.testing.assert_close(neg, torch.relu(-x)**p)
    grad, = torch.autograd.grad((pos * 3 + neg).sum(), x)
    expected, = torch.autograd.grad(
        (torch.relu(x)**p * 3 + torch.relu(-x)**p).sum(), x)
    torch.testing.assert_close(grad, expected)
