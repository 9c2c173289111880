"""pola_attention_weights: the explicit per-query weights of both polarity streams."""
import math

import pytest
import torch

from polaformer_mm.models.attention import PolaLinearAttention
from polaformer_mm.ops import (attention_entropy, pola_attention_weights, pola_exponent,
                               pola_linear_attention)
from polaformer_mm.ops.pola_attention.reference import pola_linear_attention_reference


def _inputs(B=2, h=3, N=11, n=8, d=16, dtype=torch.float64, seed=0, scale=1.):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, N, d, generator=g, dtype=dtype) * scale
    k = torch.randn(B, h, n, d, generator=g, dtype=dtype) * scale
    power = torch.randn(1, h, 1, d, generator=g, dtype=dtype)
    return q, k, power


def reference_weights(q, k, power, alpha=4.0, eps=1e-6):
    """The N x n weights of both streams, read off ``pola_linear_attention_reference``:
    its output is ``W_sim v1`` in the first ceil(d/2) channels and ``W_opp v2`` in the
    rest, so values holding one-hot rows for a block of keys (zero for the others) pick
    that block's columns of both maps. Blocks of floor(d/2) keys cover any n."""
    B, h, N, d = q.shape
    n = k.shape[2]
    d1, d2 = (d + 1) // 2, d // 2
    w_sim = q.new_zeros(B, h, N, n)
    w_opp = q.new_zeros(B, h, N, n)
    for start in range(0, n, d2):
        block = range(start, min(n, start + d2))
        v = q.new_zeros(B, h, n, d)
        for j, t in enumerate(block):
            v[:, :, t, j] = 1  # first part of v: picks W_sim[:, t]
            v[:, :, t, d1 + j] = 1  # second part: picks W_opp[:, t]
        out = pola_linear_attention_reference(q, k, v, power, alpha, eps)
        w_sim[..., start:start + len(block)] = out[..., :len(block)]
        w_opp[..., start:start + len(block)] = out[..., d1:d1 + len(block)]
    return w_sim, w_opp


def explicit_scores(q, k, power, alpha=4.0):
    """Same-signed and opposite-signed scores computed from scratch."""
    p = 1 + alpha * torch.sigmoid(power)
    qp, qn = torch.relu(q)**p, torch.relu(-q)**p
    kp, kn = torch.relu(k)**p, torch.relu(-k)**p
    t = lambda x: x.transpose(-2, -1)  # noqa: E731
    return qp @ t(kp) + qn @ t(kn), qn @ t(kp) + qp @ t(kn)


@pytest.mark.parametrize(
    'shape',
    [
        dict(N=11, n=8, d=16),  # n <= d/2: one call of the reference
        dict(N=9, n=7, d=15),  # odd head width: v splits 8 + 7
        dict(N=13, n=29, d=8),  # n > d/2: several one-hot blocks
        dict(N=5, n=1, d=4),
    ])
@pytest.mark.parametrize('alpha', [4.0, 1.5])
def test_rows_equal_the_reference_explicit_weights(shape, alpha):
    q, k, power = _inputs(**shape)
    ref_sim, ref_opp = reference_weights(q, k, power, alpha)
    w_sim, w_opp = pola_attention_weights(q, k, power, alpha)
    assert w_sim.shape == w_opp.shape == ref_sim.shape
    assert w_sim.dtype == torch.float64
    torch.testing.assert_close(w_sim, ref_sim, rtol=0, atol=1e-10)
    torch.testing.assert_close(w_opp, ref_opp, rtol=0, atol=1e-10)
    # chosen rows only: the same rows, computed without the others
    rows = torch.tensor([shape['N'] - 1, 0, 2])
    s_sim, s_opp = pola_attention_weights(q[:, :, rows], k, power, alpha)
    assert s_sim.shape[2] == 3
    torch.testing.assert_close(s_sim, ref_sim[:, :, rows], rtol=0, atol=1e-10)
    torch.testing.assert_close(s_opp, ref_opp[:, :, rows], rtol=0, atol=1e-10)


@pytest.mark.parametrize('eps', [1e-6, 1e-2])
def test_rows_sum_to_one_up_to_the_eps_term(eps):
    """A row sums to S / (S + n eps), S its unnormalised score sum: 1 - sum is exactly
    the eps term's share; with eps = 0 the sum is 1."""
    q, k, power = _inputs(N=10, n=13, d=8, scale=0.3)
    n = k.shape[2]
    for weights, scores in zip(
            pola_attention_weights(q, k, power, eps=eps), explicit_scores(q, k, power)):
        total = scores.sum(-1)
        assert (weights >= 0).all()
        torch.testing.assert_close(
            1 - weights.sum(-1), n * eps / (total + n * eps), rtol=1e-9, atol=1e-15)
    for weights in pola_attention_weights(q, k, power, eps=0.):
        torch.testing.assert_close(
            weights.sum(-1), torch.ones_like(weights[..., 0]), rtol=0, atol=1e-12)


def test_large_magnitudes_do_not_overflow_float32():
    """|x| ~ 1e4 and p up to 5: features ~ 1e20, products ~ 1e40 overflow float32 when
    formed directly; the rescaled computation stays finite and exact."""
    q, k, power = _inputs(N=6, n=9, d=8, scale=1e4, seed=3)
    power = torch.full_like(power, 6.)  # p = 1 + 4 sigmoid(6) ~ 4.99
    naive = explicit_scores(q.float(), k.float(), power.float())[0]
    assert not torch.isfinite(naive).all()  # the test does reach the overflow
    expected = explicit_scores(q, k, power)  # float64 holds them
    for w32, scores in zip(pola_attention_weights(q.float(), k.float(), power.float()), expected):
        assert torch.isfinite(w32).all()
        ref = scores / (scores.sum(-1, keepdim=True) + k.shape[2] * 1e-6)
        torch.testing.assert_close(w32.double(), ref, rtol=1e-4, atol=1e-6)


def test_exponent_one_from_minus_infinite_power():
    q, k, power = _inputs(N=7, n=5, d=6)
    minus_inf = torch.full_like(power, float('-inf'))
    assert (pola_exponent(minus_inf) == 1).all()
    w_sim, w_opp = pola_attention_weights(q, k, minus_inf, eps=0.)
    pos, neg = torch.relu, lambda x: torch.relu(-x)  # p = 1: plain relu features
    s_sim = pos(q) @ pos(k).transpose(-2, -1) + neg(q) @ neg(k).transpose(-2, -1)
    s_opp = neg(q) @ pos(k).transpose(-2, -1) + pos(q) @ neg(k).transpose(-2, -1)
    torch.testing.assert_close(w_sim, s_sim / s_sim.sum(-1, keepdim=True))
    torch.testing.assert_close(w_opp, s_opp / s_opp.sum(-1, keepdim=True))


def test_padded_windows_weigh_values_as_the_op_does():
    """On a real module's projection with padding (zero keys, eps per window), the
    weights times the value halves give the op's output."""
    torch.manual_seed(0)
    attn = PolaLinearAttention(16, 2, pos_grid=(4, 4), family='swin').double()
    with torch.no_grad():
        attn.power.normal_()
        attn.positional_encoding.normal_()
    x = torch.randn(3, 16, 16, dtype=torch.float64)
    padding = torch.zeros(3, 16, dtype=torch.bool)
    padding[1, 12:] = True  # a window with 4 padded tokens
    padding[2, 3::4] = True
    q, k, v, _, eps, _ = attn.project(x, (4, 4), padding_mask=padding)
    assert torch.is_tensor(eps)
    w_sim, w_opp = pola_attention_weights(q, k, attn.power, attn.alpha, eps)
    assert (w_sim[1][..., 12:] == 0).all() and (w_opp[2][..., 3::4] == 0).all()
    d1 = (attn.head_dims + 1) // 2
    out = torch.cat([w_sim @ v[..., :d1], w_opp @ v[..., d1:]], dim=-1)
    expected = pola_linear_attention(q, k, v, attn.power, attn.alpha, eps)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def test_entropy():
    n = 7
    uniform = torch.full((2, n), 0.3)
    assert torch.allclose(attention_entropy(uniform), torch.full((2, ), math.log(n)))
    one_hot = torch.zeros(n).index_fill_(0, torch.tensor([3]), 0.9)
    assert attention_entropy(one_hot).item() == 0
    assert torch.isnan(attention_entropy(torch.zeros(n)))
    q, k, power = _inputs(N=20, n=9, d=8)
    for weights in pola_attention_weights(q, k, power):
        entropy = attention_entropy(weights)
        assert entropy.shape == weights.shape[:-1]
        assert (entropy >= 0).all() and (entropy <= math.log(9) + 1e-12).all()


def test_bad_shapes_are_named():
    q, k, power = _inputs()
    with pytest.raises(ValueError, match='k shape'):
        pola_attention_weights(q, k[..., :4], power)
    with pytest.raises(ValueError, match='expects q_rows'):
        pola_attention_weights(q[0], k, power)
    with pytest.raises(ValueError, match='zero keys'):
        pola_attention_weights(q, k[:, :, :0], power)
    with pytest.raises(ValueError, match='power shape'):
        pola_attention_weights(q, k, power[..., :3])


def test_exact_at_the_largest_alpha():
    """alpha = ALPHA_MAX with keys of one sign far stronger than the other: the weights
    (float32) times the value halves give the exact (log-domain float64) output."""
    from polaformer_mm.ops import ALPHA_MAX
    from .test_pola_attention import log_domain_reference
    q, k, power = _inputs(N=12, n=20, d=8, dtype=torch.float32, seed=4, scale=3.)
    k = torch.where(k > 0, k, k * 0.01)
    v = torch.randn(k.shape)
    w_sim, w_opp = pola_attention_weights(q, k, power, ALPHA_MAX)
    out = torch.cat([w_sim @ v[..., :4], w_opp @ v[..., 4:]], dim=-1)
    exact = log_domain_reference(q, k, v, power, ALPHA_MAX)
    assert (out.double() - exact).abs().max() <= 1e-4
