import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from polaformer_mm.ops import ALPHA_MAX, pola_linear_attention, set_default_backend
from polaformer_mm.ops.pola_attention.reference import \
    pola_linear_attention_log_domain as log_domain_reference
from polaformer_mm.ops.pola_attention.reference import (pola_linear_attention_naive,
                                                        pola_linear_attention_reference,
                                                        polarity_features)

IMPLS = [pola_linear_attention, pola_linear_attention_naive]


def _inputs(B=2, h=3, N=37, n=23, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, N, d, generator=g, dtype=dtype)
    k = torch.randn(B, h, n, d, generator=g, dtype=dtype)
    v = torch.randn(B, h, n, d, generator=g, dtype=dtype)
    power = torch.randn(1, h, 1, d, generator=g, dtype=dtype)
    return q, k, v, power


def _grads(fn, inputs, weights, **kwargs):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs, **kwargs)
    return out, torch.autograd.grad((out * weights).sum(), inputs)


@pytest.mark.parametrize(
    'shape',
    [
        dict(N=37, n=23, d=8),
        dict(N=16, n=16, d=16),
        dict(N=50, n=1, d=4),
        dict(N=9, n=12, d=7),  # odd head width: v splits as torch.chunk does (4 + 3)
        dict(N=6, n=5, d=1),  # one channel: all of v goes to the same-signed stream
    ])
@pytest.mark.parametrize('alpha', [4.0, 2.0])
@pytest.mark.parametrize('fn', IMPLS)
def test_matches_explicit_weights(fn, shape, alpha):
    q, k, v, power = _inputs(**shape)
    out = fn(q, k, v, power, alpha=alpha)
    ref = pola_linear_attention_reference(q, k, v, power, alpha=alpha)
    assert out.shape == q.shape
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('fn', IMPLS)
@pytest.mark.parametrize('d', [6, 5])
def test_gradients_match_explicit_weights(fn, d):
    inputs = _inputs(N=21, n=13, d=d)
    weights = torch.randn(inputs[0].shape, dtype=torch.float64)
    _, grads = _grads(fn, inputs, weights)
    _, expected = _grads(pola_linear_attention_reference, inputs, weights)
    for name, g, g_ref in zip('q k v power'.split(), grads, expected):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9, msg=name)


@pytest.mark.parametrize('d', [4, 5])
def test_gradcheck(d):
    q, k, v, power = (t.requires_grad_() for t in _inputs(B=2, h=2, N=6, n=5, d=d))
    assert torch.autograd.gradcheck(pola_linear_attention, (q, k, v, power))
    eps = torch.tensor([1e-3, 0.5], dtype=torch.float64).reshape(2, 1, 1, 1)
    assert torch.autograd.gradcheck(lambda *t: pola_linear_attention(*t, alpha=2.5, eps=eps),
                                    (q, k, v, power))


@pytest.mark.parametrize('d', [4, 5])
def test_scale_folded_into_the_features(d):
    """``scale=s`` gives the output and the gradients (also of s) of passing q / s
    and k / s, and passes gradcheck."""
    q, k, v, power = _inputs(B=2, h=2, N=9, n=7, d=d)
    s = torch.nn.functional.softplus(torch.randn(1, 2, 1, d, dtype=torch.float64))
    weights = torch.randn(q.shape, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, power, s)]
    q_, k_, v_, p_, s_ = leaves
    folded = pola_linear_attention(q_, k_, v_, p_, eps=0.01, scale=s_)
    g_folded = torch.autograd.grad((folded * weights).sum(), leaves)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, power, s)]
    q_, k_, v_, p_, s_ = leaves
    ref = pola_linear_attention_reference(q_ / s_, k_ / s_, v_, p_, eps=0.01)
    g_ref = torch.autograd.grad((ref * weights).sum(), leaves)
    torch.testing.assert_close(folded, ref, rtol=1e-10, atol=1e-10)
    for name, g, g_r in zip('q k v power scale'.split(), g_folded, g_ref):
        torch.testing.assert_close(g, g_r, rtol=1e-9, atol=1e-9, msg=name)
    leaves = [t.clone().requires_grad_() for t in (q[:, :, :5], k[:, :, :4], v[:, :, :4], power, s)]
    assert torch.autograd.gradcheck(
        lambda q, k, v, p, s: pola_linear_attention(q, k, v, p, alpha=2.5, scale=s), leaves)
    with pytest.raises(ValueError, match='scale shape'):
        pola_linear_attention(q, k, v, power, scale=s[..., :1])


def test_float32_gradients_close_to_float64_reference():
    inputs = _inputs(N=64, n=48, d=16)
    weights = torch.randn(inputs[0].shape, dtype=torch.float64)
    out, grads = _grads(pola_linear_attention, [t.float() for t in inputs], weights.float())
    ref, expected = _grads(pola_linear_attention_reference, inputs, weights)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    for name, g, g_ref in zip('q k v power'.split(), grads, expected):
        scale = g_ref.abs().max().item()
        torch.testing.assert_close(g.double(), g_ref, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_streams_are_what_the_method_says():
    """Same-signed stream in the first half of the head width, opposite in the rest,
    each a weighted average of its half of v (weights >= 0 summing to ~1)."""
    q, k, v, power = _inputs(N=5, n=7, d=4)
    v = torch.ones_like(v)
    out = pola_linear_attention(q, k, v, power)
    # with v == 1 every row of normalised weights sums to 1 (up to eps)
    torch.testing.assert_close(out, torch.ones_like(out), rtol=1e-4, atol=1e-4)


class _LargestTensor:
    """Records the element count of the largest tensor any operator takes, through
    torch's profiler (every tensor an operator makes is the input of the next one)."""

    def __enter__(self):
        self._prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        self._prof.__exit__(*exc)
        self.largest = max((math.prod(shape) for evt in self._prof.events()
                            for shape in evt.input_shapes if shape),
                           default=0)
        return False


def test_never_forms_an_n_by_n_matrix_forward_or_backward():
    N = n = 512
    q, k, v, power = (t.requires_grad_() for t in _inputs(B=1, h=1, N=N, n=n, d=4))
    sizes = {}
    for fn in (pola_linear_attention, pola_linear_attention_reference):
        with _LargestTensor() as forward:
            out = fn(q, k, v, power)
        with _LargestTensor() as backward:
            out.sum().backward()
        sizes[fn.__name__] = (forward.largest, backward.largest)
    assert min(sizes['pola_linear_attention_reference']) >= N * n  # the check can fail
    assert max(sizes['pola_linear_attention']) < N * n // 16, sizes


class _SavedBytes:
    """Bytes of the tensors autograd saves for the backward pass (views of the inputs
    and of the output are free: they are alive anyway)."""

    def __init__(self, free):
        self.free = {t.untyped_storage().data_ptr() for t in free}
        self.nbytes = 0

    def pack(self, t):
        if t.untyped_storage().data_ptr() not in self.free:
            self.nbytes += t.untyped_storage().nbytes()
        return t


def test_backward_keeps_only_inputs_and_the_small_summary():
    B, h, N, n, d = 2, 3, 300, 200, 8
    q, k, v, power = (t.requires_grad_() for t in _inputs(B, h, N, n, d))
    saved = {}
    for fn in (pola_linear_attention, pola_linear_attention_naive):
        hooks = _SavedBytes([q, k, v, power])
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, lambda t: t):
            fn(q, k, v, power)
        saved[fn.__name__] = hooks.nbytes
    # W (2d x (d+2)) and one shift per (batch, head): O(B h d^2)
    assert saved['pola_linear_attention'] <= B * h * (2 * d * (d + 2) + 1) * 8, saved
    assert saved['pola_linear_attention_naive'] > B * h * N * d * 8  # the check can fail


def test_bad_shapes_are_named():
    q, k, v, power = _inputs()
    with pytest.raises(ValueError, match=r'v shape'):
        pola_linear_attention(q, k, v[:, :, :-1], power)
    with pytest.raises(ValueError, match=r'power shape'):
        pola_linear_attention(q, k, v, power[:, :1])
    with pytest.raises(ValueError, match=r'power shape'):
        pola_linear_attention(q, k, v, power.expand(2, -1, -1, -1))
    with pytest.raises(ValueError, match=r'q \(B,h,N,d\)'):
        pola_linear_attention(q[0], k, v, power)


@pytest.mark.parametrize('alpha', [float('nan'), float('inf'), 0.0, -0.5, True, '4'])
@pytest.mark.parametrize('fn', IMPLS + [pola_linear_attention_reference])
def test_alpha_must_be_finite_and_positive(fn, alpha):
    q, k, v, power = _inputs(N=4, n=3, d=4)
    with pytest.raises(ValueError, match='alpha must be a finite number > 0'):
        fn(q, k, v, power, alpha=alpha)


def test_bad_eps_is_named():
    q, k, v, power = _inputs(B=2, h=3, N=4, n=3, d=4)
    for eps in (0.0, -1e-6, float('nan')):
        with pytest.raises(ValueError, match='eps must be a finite number > 0'):
            pola_linear_attention(q, k, v, power, eps=eps)
    with pytest.raises(ValueError, match=r'eps shape \(3, 1, 1, 1\) must broadcast'):
        pola_linear_attention(q, k, v, power, eps=torch.full((3, 1, 1, 1), 1e-6))
    with pytest.raises(ValueError, match=r'eps shape \(2, 3, 4, 1\) must broadcast'):
        pola_linear_attention(q, k, v, power, eps=torch.full((2, 3, 4, 1), 1e-6))
    with pytest.raises(ValueError, match='must not require grad'):
        pola_linear_attention(q, k, v, power, eps=torch.ones(2, 1, 1, 1).requires_grad_())


def test_backend_choice():
    q, k, v, power = _inputs(N=4, n=3, d=4)
    with pytest.raises(ValueError, match='backend must be one of'):
        pola_linear_attention(q, k, v, power, backend='cuda')
    with pytest.raises(ValueError, match='backend must be one of'):
        set_default_backend('fast')
    # 'auto' on the CPU is the torch path; a forced 'triton' is refused on the CPU
    previous = set_default_backend('torch')
    try:
        assert previous == 'auto'
        torch.testing.assert_close(
            pola_linear_attention(q, k, v, power),
            pola_linear_attention(q, k, v, power, backend='auto'))
    finally:
        set_default_backend(previous)
    with pytest.raises((ValueError, RuntimeError), match='Triton|CUDA'):
        pola_linear_attention(q.float(), k.float(), v.float(), power.float(), backend='triton')


def test_forced_triton_names_every_reason_the_kernels_refuse_the_inputs():
    """One list of reasons (the Triton backend's) decides 'auto' and words the error of
    a forced 'triton': float64 CPU tensors wider than the kernels' head width give all
    of them, in one message."""
    from polaformer_mm.ops.pola_attention import triton_backend as kernels
    q, k, v, power = _inputs(N=4, n=3, d=kernels.MAX_HEAD_DIM + 2)
    reasons = kernels.unsupported_reasons(q, k, v, power)
    assert 'the kernels need CUDA tensors (got cpu)' in reasons
    assert f'head width {kernels.MAX_HEAD_DIM + 2} > {kernels.MAX_HEAD_DIM}' in reasons
    assert ('q is torch.float64, k is torch.float64, v is torch.float64, power is '
            'torch.float64 (the kernels take float32, float16 and bfloat16)') in reasons
    assert kernels.available() == (kernels.unavailable_reason() not in reasons)
    error = ValueError if kernels.available() else RuntimeError
    with pytest.raises(error) as info:
        pola_linear_attention(q, k, v, power, backend='triton')
    assert all(reason in str(info.value) for reason in reasons), (reasons, str(info.value))
    assert 'use backend="torch"' in str(info.value)
    # inputs the kernels take but for the device: only that (and Triton's absence)
    q, k, v, power = (t[..., :8].float() for t in (q, k, v, power))
    left = kernels.unsupported_reasons(q, k, v, power)
    expected = ['the kernels need CUDA tensors (got cpu)']
    if not kernels.available():
        expected.insert(0, kernels.unavailable_reason())
    assert left == expected
    # 'auto' on the CPU never asks: the torch path
    torch.testing.assert_close(
        pola_linear_attention(q, k, v, power, backend='auto'),
        pola_linear_attention(q, k, v, power, backend='torch'),
        rtol=0,
        atol=0)


def test_output_keeps_the_layout_of_q():
    """Queries split from (B, N, h*d) tokens give an output in the same layout, so that
    merging the heads back is a view."""
    B, N, h, d = 2, 10, 3, 4
    tokens = torch.randn(B, N, h * d)
    q = tokens.reshape(B, N, h, d).transpose(1, 2)
    _, k, v, power = _inputs(B, h, N, 7, d, dtype=torch.float32)
    out = pola_linear_attention(q, k, v, power)
    assert out.stride() == q.stride()
    torch.testing.assert_close(out, pola_linear_attention(q.contiguous(), k, v, power))
    # queries sliced from a wider projection (q, k, v, g of one linear layer)
    q = torch.randn(B, N, 4, h * d)[:, :, 0].unflatten(-1, (h, d)).transpose(1, 2)
    out = pola_linear_attention(q, k, v, power)
    assert out.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(out, pola_linear_attention(q.contiguous(), k, v, power))


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
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0], dtype=torch.float64, requires_grad=True)
    p = torch.tensor(2.5, dtype=torch.float64)
    pos, neg = polarity_features(x, p)
    torch.testing.assert_close(pos, torch.relu(x)**p)
    torch.testing.assert_close(neg, torch.relu(-x)**p)
    grad, = torch.autograd.grad((pos * 3 + neg).sum(), x)
    expected, = torch.autograd.grad((torch.relu(x)**p * 3 + torch.relu(-x)**p).sum(), x)
    torch.testing.assert_close(grad, expected)


# --- magnitudes: the features are normalised before the power --------------------------


def _scale_features(x, c, power, alpha):
    """x scaled so that its polarity features are multiplied by c (broadcastable)."""
    p = 1 + alpha * torch.sigmoid(power)
    return x * c**(1 / p)


def test_feature_scaling_only_reweights_eps():
    """The identity behind the normalisation, on the float64 reference: multiplying the
    features of one query by c, or all key features of one (batch, head) by c, gives
    the output of the original features with eps / c."""
    alpha = 4.0
    B, h, N, n, d = 2, 3, 5, 7, 6
    q, k, v, power = _inputs(B, h, N, n, d)
    eps = 0.3  # large, so that ignoring it would fail the test
    c_row = torch.rand(B, h, N, 1, dtype=torch.float64) * 1e3 + 1e-3
    scaled_q = _scale_features(q, c_row, power, alpha)
    out = pola_linear_attention_reference(scaled_q, k, v, power, alpha, eps)
    for i in range(N):
        row = slice(i, i + 1)
        expected = pola_linear_attention_reference(
            q[:, :, row], k, v, power, alpha, eps=eps / c_row[:, :, row])
        torch.testing.assert_close(out[:, :, row], expected, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out, pola_linear_attention_reference(q, k, v, power, alpha, eps))

    c_head = torch.rand(B, h, 1, 1, dtype=torch.float64) * 1e3 + 1e-3
    scaled_k = _scale_features(k, c_head, power, alpha)
    torch.testing.assert_close(
        pola_linear_attention_reference(q, scaled_k, v, power, alpha, eps),
        pola_linear_attention_reference(q, k, v, power, alpha, eps=eps / c_head),
        rtol=1e-12,
        atol=1e-12)


def test_large_magnitudes_stay_finite_and_accurate():
    """|x| ~ 1e4 with an exponent near 5: the unnormalised float32 maths overflows."""
    B, h, N, n, d = 2, 2, 40, 30, 16
    q, k, v, _ = _inputs(B, h, N, n, d)
    q, k = q * 1e4, k * 1e4
    power = torch.full((1, h, 1, d), 10.0, dtype=torch.float64)  # p = 1 + 4 sigmoid(10)
    ref = pola_linear_attention_reference(q, k, v, power)
    assert torch.isfinite(ref).all()
    args32 = [t.float() for t in (q, k, v, power)]
    naive = pola_linear_attention_naive(*args32)
    assert not torch.isfinite(naive).all()  # the case is a real one
    weights = torch.randn(q.shape, dtype=torch.float32)
    out, grads = _grads(pola_linear_attention, args32, weights)
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    _, expected = _grads(pola_linear_attention_reference, (q, k, v, power), weights.double())
    for name, g, g_ref in zip('q k v power'.split(), grads, expected):
        scale = g_ref.abs().max().item()
        torch.testing.assert_close(g.double(), g_ref, rtol=1e-3, atol=1e-4 * scale, msg=name)


@pytest.mark.parametrize('magnitude', [3.0, 1e-3])
def test_large_alpha_stays_finite(magnitude):
    """alpha = 50: exponents up to 51 (3 ** 51 ~ 2e24, whose products overflow)."""
    q, k, v, power = _inputs(N=30, n=20, d=8)
    q = q.sign() * magnitude * (1 + 0.1 * q.abs())
    k = k.sign() * magnitude * (1 + 0.1 * k.abs())
    ref = pola_linear_attention_reference(q, k, v, power, alpha=50.0)
    args32 = [t.float() for t in (q, k, v, power)]
    weights = torch.randn(q.shape)
    out, grads = _grads(pola_linear_attention, args32, weights, alpha=50.0)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('alpha', [4.0, 0.5, 1e-3])
def test_exact_zeros_have_finite_gradients(alpha):
    q, k, v, power = _inputs(N=12, n=10, d=6)
    q[..., ::3] = 0  # some zero channels
    q[:, :, 0] = 0  # a zero query
    k[:, :, 1::2, 1] = 0
    k[1, 0] = 0  # a (batch, head) without a non-zero key
    weights = torch.randn(q.shape, dtype=torch.float64)
    for dtype in (torch.float64, torch.float32):
        inputs = [t.to(dtype) for t in (q, k, v, power)]
        out, grads = _grads(pola_linear_attention, inputs, weights.to(dtype), alpha=alpha)
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    out, grads = _grads(pola_linear_attention, (q, k, v, power), weights, alpha=alpha)
    ref, expected = _grads(pola_linear_attention_reference, (q, k, v, power), weights, alpha=alpha)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for name, g, g_ref in zip('q k v power'.split(), grads, expected):
        torch.testing.assert_close(g, g_ref, rtol=1e-8, atol=1e-10, msg=name)
    assert (grads[0][q == 0] == 0).all()  # relu(x) ** p has slope 0 at 0 (p > 1)


# --- tensor eps: zero-padded keys -------------------------------------------------------


@pytest.mark.parametrize('magnitude', [1.0, 1e3])
def test_zero_padded_keys_with_per_entry_eps_equal_the_real_keys(magnitude):
    """Keys padded with zero rows (k = v = 0 there) and eps * n_real / n per batch entry
    give the output of the real keys alone."""
    B, h, N, n, d, eps = 3, 2, 9, 12, 6, 1e-2  # a large eps, so that its scaling counts
    q, k, v, power = _inputs(B, h, N, n, d)
    q, k = q * magnitude, k * magnitude
    n_real = [5, 12, 8]
    mask = torch.zeros(B, 1, n, 1, dtype=torch.bool)
    for b, m in enumerate(n_real):
        mask[b, :, torch.randperm(n)[:m]] = True  # real keys anywhere
    k_pad, v_pad = k * mask, v * mask
    eps_b = torch.tensor(n_real, dtype=torch.float64).reshape(B, 1, 1, 1) * eps / n
    weights = torch.randn(q.shape, dtype=torch.float64)
    out, (g_q, g_k, g_v, _) = _grads(
        pola_linear_attention, (q, k_pad, v_pad, power), weights, eps=eps_b)
    ref = pola_linear_attention_reference(q, k_pad, v_pad, power, eps=eps_b)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for b in range(B):
        keep = mask[b, 0, :, 0]
        real = (q[b:b + 1], k[b:b + 1, :, keep], v[b:b + 1, :, keep], power)
        expected, (e_q, e_k, e_v, _) = _grads(
            pola_linear_attention, real, weights[b:b + 1], eps=eps)
        torch.testing.assert_close(out[b:b + 1], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_q[b:b + 1], e_q, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g_k[b:b + 1, :, keep], e_k, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g_v[b:b + 1, :, keep], e_v, rtol=1e-10, atol=1e-12)
    if magnitude == 1.0:  # without the eps correction the results differ
        plain = pola_linear_attention(q, k_pad, v_pad, power, eps=eps)
        assert not torch.allclose(plain[0], out[0], rtol=1e-9, atol=1e-9)


def test_tensor_eps_per_head():
    q, k, v, power = _inputs(B=2, h=3, N=5, n=4, d=4)
    eps = torch.rand(2, 3, 1, 1, dtype=torch.float64) + 0.1
    out = pola_linear_attention(q, k, v, power, eps=eps)
    for b in range(2):
        for i in range(3):
            sl = (slice(b, b + 1), slice(i, i + 1))
            expected = pola_linear_attention_reference(
                q[sl], k[sl], v[sl], power[:, i:i + 1], eps=eps[b, i].item())
            torch.testing.assert_close(out[sl], expected, rtol=1e-12, atol=1e-12)


def test_large_queries_that_meet_only_zero_key_channels():
    """A query row whose non-zero channels are zero in every key: 0 / (0 + eps) = 0, also
    when the shifts of the row and of the keys are large (eps must not underflow)."""
    B, h, N, n, d = 1, 1, 4, 6, 4
    q, k, v, _ = _inputs(B, h, N, n, d)
    q, k = q * 1e4, k * 1e4
    q[..., 0, 1:] = 0  # row 0 only in channel 0 ...
    k[..., 0] = 0  # ... which no key has
    power = torch.full((1, h, 1, d), 10.0, dtype=torch.float64)
    ref = pola_linear_attention_reference(q, k, v, power)
    weights = torch.randn(q.shape)
    out, grads = _grads(pola_linear_attention, [t.float() for t in (q, k, v, power)], weights)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert (out[..., 0, :] == 0).all() and (ref[..., 0, :] == 0).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


class _ExpResults(TorchFunctionMode):
    """Records whether any ``exp`` result of float32 maths is a subnormal number (every
    ``torch.exp`` / ``Tensor.exp`` / ``Tensor.exp_`` call, forward and backward)."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.subnormal = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, '__name__', None) in ('exp', 'exp_') and isinstance(out, torch.Tensor):
            tiny = torch.finfo(out.dtype).tiny
            self.calls += 1
            self.subnormal += int(((out != 0) & (out.abs() < tiny)).sum())
        return out


def test_exp_never_returns_subnormals():
    """Inputs spanning 1e-30..1e4 with exponents up to 5: every exponent below the
    floor is clamped so that ``exp`` returns a normal number (a subnormal result sends
    the vectorised CPU ``exp`` down a path about 50 times slower), forward and
    backward (the backward pass recomputes the features with the same helpers; torch
    function modes see the forward pass only)."""
    q, k, v, _ = _inputs(N=64, n=48, d=8, dtype=torch.float32)
    q = q.sign() * 10.0**torch.empty_like(q).uniform_(-30, 4)
    k = k.sign() * 10.0**torch.empty_like(k).uniform_(-30, 4)
    power = torch.full((1, 3, 1, 8), 10.0)
    q, k, v, power = (t.requires_grad_() for t in (q, k, v, power))
    with _ExpResults() as seen:
        out = pola_linear_attention(q, k, v, power)
    out.sum().backward()
    assert seen.calls >= 3  # features of q and k, the scaled eps
    assert seen.subnormal == 0
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()


@pytest.mark.parametrize(
    'shape, block',
    [
        (dict(B=3, h=2, N=37, n=23, d=5), 16),  # token blocks of one batch entry
        (dict(B=2, h=3, N=9, n=40, d=4), 20),  # keys in more blocks than queries
        (dict(B=10, h=1, N=3, n=4, d=2), 8),  # blocks of whole batch entries
        (dict(B=2, h=2, N=11, n=6, d=3), 1 << 18),  # one block
    ])
def test_blocks_give_the_result_of_the_whole(monkeypatch, shape, block):
    """The torch path runs over blocks of tokens / batch entries: forced to small
    blocks it gives the values and gradients (q, k, v, power, scale) of the explicit
    weights, with per-entry eps and queries in the token layout."""
    from polaformer_mm.ops.pola_attention import function as module
    monkeypatch.setattr(module, 'BLOCK_ELEMENTS', block)
    q, k, v, power = _inputs(**shape, seed=3)
    B, h, N, d = q.shape
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, N, h, d) in memory
    blocks_q, blocks_k = len(list(module.token_blocks(q))), len(list(module.token_blocks(k)))
    assert (blocks_q, blocks_k) != (1, 1) if block < 100 else (blocks_q, blocks_k) == (1, 1)
    assert len(list(module.token_blocks(q.to('meta')))) == 1  # one block off the CPU
    s = torch.nn.functional.softplus(torch.randn(1, h, 1, d, dtype=torch.float64))
    eps = torch.rand(B, 1, 1, 1, dtype=torch.float64) + 0.01
    weights = torch.randn(q.shape, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k * 3, v, power, s)]
    out = pola_linear_attention(*leaves[:4], alpha=2.5, eps=eps, scale=leaves[4])
    grads = torch.autograd.grad((out * weights).sum(), leaves)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k * 3, v, power, s)]
    q_, k_, v_, p_, s_ = ref_leaves
    ref = pola_linear_attention_reference(q_ / s_, k_ / s_, v_, p_, alpha=2.5, eps=eps)
    expected = torch.autograd.grad((ref * weights).sum(), ref_leaves)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    assert out.stride() == q.stride()
    for name, g, g_ref in zip('q k v power scale'.split(), grads, expected):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9, msg=name)


# --- every alpha the op takes: exact, or refused ----------------------------------------


def test_log_domain_reference_is_the_reference():
    """Where the powers of the explicit-weights reference do not overflow, both agree."""
    q, k, v, power = _inputs(N=13, n=11, d=6)
    eps = torch.rand(2, 3, 1, 1, dtype=torch.float64) * 0.1 + 1e-3
    for alpha in (4.0, 30.0):
        torch.testing.assert_close(
            log_domain_reference(q, k, v, power, alpha, eps),
            pola_linear_attention_reference(q, k, v, power, alpha, eps),
            rtol=1e-11,
            atol=1e-12)


def _moderate_inputs(kind, B=2, h=2, N=64, n=48, d=16, seed=0):
    """Queries and keys as a trained model gives them (magnitudes 0.1 to 10): plain,
    small, large, and keys of one sign far stronger than the other (a channel's
    positive keys up to 4, its negative ones under 0.3)."""
    q, k, v, power = _inputs(B, h, N, n, d, dtype=torch.float32, seed=seed)
    if kind == 'small':
        q, k = q * 0.3, k * 0.3
    elif kind == 'large':
        q, k = q * 3, k * 3
    elif kind == 'one_sign_keys':
        k = torch.where(k > 0, k * 2, k * 0.1)
    return q, k, v, power


@pytest.mark.parametrize('kind', ['plain', 'small', 'large', 'one_sign_keys'])
@pytest.mark.parametrize('alpha', [4.0, 20.0, 50.0, ALPHA_MAX])
def test_float32_within_1e_4_of_the_exact_result_for_every_alpha_it_takes(alpha, kind):
    """The shared shifts of the features (largest of each query row, largest of each
    (batch, head)'s keys) floor whole streams once alpha times the spread of log|x|
    passes float32's exponent range; those blocks take the exact scheme."""
    q, k, v, power = _moderate_inputs(kind)
    exact = log_domain_reference(q, k, v, power, alpha)
    out = pola_linear_attention(q, k, v, power, alpha)
    assert (out.double() - exact).abs().max() <= 1e-4


@pytest.mark.parametrize('alpha', [50.0, ALPHA_MAX])
def test_float32_gradients_at_large_alpha(alpha):
    q, k, v, power = _moderate_inputs('plain', N=24, n=20, d=8)
    weights = torch.randn(q.shape, dtype=torch.float64)
    _, grads = _grads(pola_linear_attention, (q, k, v, power), weights.float(), alpha=alpha)
    ref_inputs = [t.double() for t in (q, k, v, power)]
    _, expected = _grads(log_domain_reference, ref_inputs, weights, alpha=alpha)
    for name, g, g_ref in zip('q k v power'.split(), grads, expected):
        assert torch.isfinite(g).all(), name
        scale = g_ref.abs().max().item()
        torch.testing.assert_close(g.double(), g_ref, rtol=1e-3, atol=1e-3 * scale, msg=name)


def test_float64_exact_at_the_bound():
    q, k, v, power = (t.double() for t in _moderate_inputs('large', N=20, n=16, d=8))
    weights = torch.randn(q.shape, dtype=torch.float64)
    out, grads = _grads(pola_linear_attention, (q, k, v, power), weights, alpha=ALPHA_MAX)
    ref, expected = _grads(log_domain_reference, (q, k, v, power), weights, alpha=ALPHA_MAX)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    for name, g, g_ref in zip('q k v power'.split(), grads, expected):
        torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-6 * g_ref.abs().max(), msg=name)


def test_fast_and_exact_blocks_in_one_call(monkeypatch):
    """Blocks take the scheme their values need, forward and backward alike: batch
    entry 0 of moderate magnitude, entry 1 with negative queries and keys whose negative
    values are 3e4 times weaker than the positive ones (the same-signed stream's terms
    all lie far below the shared shifts); small blocks, so that both kinds occur in one
    call (and a scale). Keys that far apart send the whole call to the exact scheme at
    once; here that shortcut is held off, so that the test of every block decides."""
    from polaformer_mm.ops.pola_attention import function as module
    monkeypatch.setattr(module, 'BLOCK_ELEMENTS', 64)
    monkeypatch.setattr(module, 'beyond_shared_shifts', lambda *args: False)
    q, k, v, power = _inputs(B=2, h=2, N=30, n=20, d=4, seed=5)
    k[1] = torch.where(k[1] > 0, k[1] * 30, k[1] * 0.001)
    q[1] = -q[1].abs() * 30
    power = 3 + 0.1 * power  # exponents near 96
    s = torch.nn.functional.softplus(torch.randn(1, 2, 1, 4, dtype=torch.float64))
    decisions = []
    inexact = module.shared_shifts_lose_rows

    def recording(inv_den):
        decisions.append(inexact(inv_den))
        return decisions[-1]

    monkeypatch.setattr(module, 'shared_shifts_lose_rows', recording)
    weights = torch.randn(q.shape, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, power, s)]
    out = pola_linear_attention(*leaves[:4], alpha=100.0, eps=1e-3, scale=leaves[4])
    grads = torch.autograd.grad((out * weights).sum(), leaves)
    assert True in decisions and False in decisions, decisions
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v, power, s)]
    q_, k_, v_, p_, s_ = ref_leaves
    ref = log_domain_reference(q_ / s_, k_ / s_, v_, p_, 100.0, eps=1e-3)
    expected = torch.autograd.grad((ref * weights).sum(), ref_leaves)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    for name, g, g_ref in zip('q k v power scale'.split(), grads, expected):
        torch.testing.assert_close(g, g_ref, rtol=1e-7, atol=1e-7 * g_ref.abs().max(), msg=name)


@pytest.mark.parametrize('alpha', [ALPHA_MAX * 1.001, 1e6])
@pytest.mark.parametrize('fn', IMPLS + [pola_linear_attention_reference])
def test_alpha_beyond_the_bound_is_refused_with_the_reason(fn, alpha):
    q, k, v, power = _inputs(N=4, n=3, d=4)
    with pytest.raises(
            ValueError, match=f'alpha must be at most {ALPHA_MAX:g}; .*float32 rounding of log'):
        fn(q, k, v, power, alpha=alpha)


def test_a_module_with_alpha_beyond_the_bound_is_refused_when_built():
    from polaformer_mm.models import PolaLinearAttention
    PolaLinearAttention(32, num_heads=2, pos_grid=(4, 4), alpha=ALPHA_MAX)
    with pytest.raises(ValueError, match=f'alpha must be at most {ALPHA_MAX:g}'):
        PolaLinearAttention(32, num_heads=2, pos_grid=(4, 4), alpha=2 * ALPHA_MAX)


# --- the other arguments: a named error or a defined result -----------------------------


@pytest.mark.parametrize('fn', IMPLS + [pola_linear_attention_reference])
@pytest.mark.parametrize('B, N', [(0, 5), (2, 0), (0, 0)])
def test_no_queries_give_an_empty_output_forward_and_backward(fn, B, N):
    _, k, v, power = _inputs(B=max(B, 1), h=2, N=1, n=4, d=6)
    k, v = k[:B], v[:B]
    q = torch.randn(B, 2, N, 6, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, power)]
    out = fn(*leaves)
    assert out.shape == (B, 2, N, 6)
    out.sum().backward()
    assert leaves[0].grad.shape == q.shape
    for leaf in leaves[1:]:
        assert leaf.grad is None or (leaf.grad == 0).all()


def test_inputs_of_float64_and_another_dtype_are_named():
    q, k, v, power = _inputs(N=4, n=3, d=4)
    with pytest.raises(ValueError, match=r'q is torch\.float32 but k is torch\.float64'):
        pola_linear_attention(q.float(), k, v, power)
    with pytest.raises(ValueError, match=r'q is torch\.float64 but v is torch\.float16'):
        pola_linear_attention(q, k, v.half(), power)
    with pytest.raises(ValueError, match=r'k must be a floating-point tensor, got torch\.int64'):
        pola_linear_attention(q, k.long(), v, power)
    with pytest.raises(ValueError, match=r'q is on cpu but k is on meta'):
        pola_linear_attention(q, k.to('meta'), v, power)


def test_half_and_float32_inputs_may_mix():
    """As autocast hands them over (keys plus a float32 positional encoding): computed
    in float32, the result in q's dtype."""
    q, k, v, power = (t.float() for t in _inputs(N=16, n=12, d=8))
    expected = pola_linear_attention(q.bfloat16().float(), k, v.bfloat16().float(), power)
    out = pola_linear_attention(q.bfloat16(), k, v.bfloat16(), power)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize('bad', [-1.0, 0.0, float('nan'), float('inf')])
def test_a_tensor_eps_is_refused_where_the_same_float_is(bad):
    q, k, v, power = _inputs(B=2, h=3, N=4, n=3, d=4)
    with pytest.raises(ValueError, match='eps must be a finite number > 0'):
        pola_linear_attention(q, k, v, power, eps=bad)
    eps = torch.tensor([1e-6, bad], dtype=torch.float64).reshape(2, 1, 1, 1)
    with pytest.raises(ValueError, match=r'eps must be finite and > 0 everywhere .* holds '):
        pola_linear_attention(q, k, v, power, eps=eps)


@pytest.mark.parametrize('bad', [-0.5, 0.0, float('nan'), float('inf')])
def test_a_scale_that_is_not_positive_is_refused(bad):
    """The docstring's contract: a positive divisor of q and k."""
    q, k, v, power = _inputs(B=2, h=2, N=4, n=3, d=4)
    scale = torch.ones(1, 2, 1, 4, dtype=torch.float64)
    scale[0, 1, 0, 2] = bad
    with pytest.raises(ValueError, match=r'scale must be finite and > 0 everywhere \(it divides'):
        pola_linear_attention(q, k, v, power, scale=scale)
    with pytest.raises(ValueError, match='scale shape'):
        pola_linear_attention(q, k, v, power, scale=1.0)


def test_keys_beyond_the_shared_range_take_the_exact_scheme_at_once(monkeypatch):
    """A channel whose negative keys all lie under the shared shifts' floor: every block
    is computed with the exact scheme without first trying the shared one."""
    from polaformer_mm.ops.pola_attention import function as module
    tested = []
    inexact = module.shared_shifts_lose_rows
    monkeypatch.setattr(module, 'shared_shifts_lose_rows',
                        lambda inv_den: tested.append(1) or inexact(inv_den))
    q, k, v, power = _moderate_inputs('plain', N=40, n=30, d=8)
    k[..., 0] = torch.where(k[..., 0] > 0, k[..., 0] * 3, k[..., 0] * 1e-3)
    out = pola_linear_attention(q, k, v, power, ALPHA_MAX)
    assert not tested
    assert (out.double() - log_domain_reference(q, k, v, power, ALPHA_MAX)).abs().max() <= 1e-4
    pola_linear_attention(q, k, v, power, 4.0)
    assert tested  # at alpha 4 the same keys stay in range
