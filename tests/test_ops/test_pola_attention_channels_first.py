"""The channels-first form of the op (what an ONNX export records) gives the plain
formulation's results: any head width (even, odd, one channel), padding keys given as key
weights (with zero values) in place of zero keys, a tensor eps, magnitudes far from 1,
half precision computed in float32; its per-token channel maximum is exact; and the
module's channels-first forward gives its forward for both projection families, with and
without spatial reduction and padding, its keys' ``P`` divided by their scale before
the resize."""
import contextlib

import pytest
import torch

from polaformer_mm.models import PolaLinearAttention
from polaformer_mm.models.utils import resize_channels_first, resize_token_grid
from polaformer_mm.ops.pola_attention import pola_linear_attention_plain
from polaformer_mm.ops.pola_attention.channels_first import (channel_max,
                                                             pola_linear_attention_channels_first)
from polaformer_mm.utils.capture import exportable


def _heads_first(t):  # (B, h, d, T) -> (B, h, T, d)
    return t.transpose(-2, -1)


def _inputs(B=2, h=3, N=37, n=23, d=8, dtype=torch.float64, seed=0, magnitude=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, d, T, generator=g, dtype=dtype) * magnitude for T in (N, n, n))
    power = torch.randn(1, h, 1, d, generator=g, dtype=dtype)
    return q, k, v, power


def _plain(q, k, v, power, alpha, eps):
    out = pola_linear_attention_plain(
        _heads_first(q), _heads_first(k), _heads_first(v), power, alpha, eps, None)
    return _heads_first(out)


@pytest.mark.parametrize('d', [8, 7, 1, 32])
@pytest.mark.parametrize('alpha', [1.0, 4.0])
def test_equals_the_plain_formulation(d, alpha):
    q, k, v, power = _inputs(d=d)
    got = pola_linear_attention_channels_first(q, k, v, power, alpha, 1e-6)
    assert got.shape == q.shape
    torch.testing.assert_close(got, _plain(q, k, v, power, alpha, 1e-6), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('magnitude', [1e-3, 30.0])
def test_far_magnitudes_in_float32(magnitude):
    q, k, v, power = _inputs(d=16, dtype=torch.float32, magnitude=magnitude)
    got = pola_linear_attention_channels_first(q, k, v, power, 4.0, 1e-6)
    want = _plain(*(t.double() for t in (q, k, v, power)), 4.0, 1e-6)
    assert torch.isfinite(got).all()
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5


def test_key_weights_stand_for_zero_padding_keys():
    """Keys marked 0 by ``key_weights`` (with zero values, any key) give the plain op's
    result on keys set to zero there, with eps scaled per entry as the modules scale it."""
    q, k, v, power = _inputs(B=3, n=20, d=6)
    keep = torch.ones(3, 1, 20, 1, dtype=q.dtype)
    keep[1, :, 12:] = 0
    keep[2, :, ::3] = 0
    mask = keep.view(3, 1, 1, 20)
    v = v * mask
    eps = keep.sum(dim=2).view(3, 1, 1, 1) * (1e-6 / 20)
    padding_keys = torch.where(mask > 0, k, k * 7.0 + 1)  # any keys where the weight is 0
    got = pola_linear_attention_channels_first(q, padding_keys, v, power, 4.0, eps, keep)
    want = _plain(q, k * mask, v, power, 4.0, eps)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_eps_per_head():
    q, k, v, power = _inputs(h=2, d=4, magnitude=1e-3)
    eps = torch.tensor([1e-6, 1e-2], dtype=q.dtype).view(1, 2, 1, 1)
    torch.testing.assert_close(
        pola_linear_attention_channels_first(q, k, v, power, 4.0, eps),
        _plain(q, k, v, power, 4.0, eps))


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(dtype):
    q, k, v, power = _inputs(d=8, dtype=torch.float32, magnitude=20.0)
    got = pola_linear_attention_channels_first(*(t.to(dtype) for t in (q, k, v)), power, 4.0, 1e-6)
    assert got.dtype == dtype and torch.isfinite(got).all()
    want = _plain(*(t.to(dtype).double() for t in (q, k, v)), power.double(), 4.0, 1e-6)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    'family, sr_ratio, channels, heads, hw, padded',
    [
        ('swin', 1, 24, 3, (8, 8), True),
        ('swin', 1, 16, 2, (5, 7), False),
        ('swin', 1, 9, 1, (4, 4), True),  # odd head width
        ('pvt', 2, 16, 1, (9, 7), False),
        ('pvt', 1, 20, 2, (6, 5), False),
    ])
def test_module_forward_channels_first_equals_forward(family, sr_ratio, channels, heads, hw,
                                                      padded):
    torch.manual_seed(0)
    module = PolaLinearAttention(channels, heads, (4, 4), sr_ratio=sr_ratio, family=family).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    B, N = 3, hw[0] * hw[1]
    x = torch.randn(B, N, channels)
    padding = None
    if padded:
        padding = torch.zeros(B, N, dtype=torch.bool)
        padding[1, -5:] = True
        padding[2, ::2] = True
    with torch.no_grad():
        want = module(x, hw, padding_mask=padding)
        got = module.forward_channels_first(x, hw, padding_mask=padding)
    real = torch.ones(B, N, dtype=torch.bool) if padding is None else ~padding
    assert got.shape == want.shape and got.is_contiguous()
    assert float((got - want)[real].abs().max() / want[real].abs().max()) < 1e-5


def test_module_channels_first_names_bad_input():
    module = PolaLinearAttention(16, 2, (4, 4), sr_ratio=2, family='pvt')
    with pytest.raises(ValueError, match=r'expects \(B, 4\*4, 16\) tokens'):
        module.forward_channels_first(torch.randn(1, 15, 16), (4, 4))
    with pytest.raises(ValueError, match='padding_mask needs keys on the query grid'):
        module.forward_channels_first(
            torch.randn(1, 16, 16), (4, 4), padding_mask=torch.zeros(1, 16, dtype=torch.bool))


def _edge_inputs(kind, B, h, N, n, d):
    """float32 inputs of the channels-first form: plain, large (|x| ~ 1e4 with exponents
    near 5), small (1e-3), the keys of one (batch, head) all zero, keys of one sign far
    stronger than the other, zero queries, and query rows spread over four decades."""
    q, k, v, power = _inputs(B=B, h=h, N=N, n=n, d=d, dtype=torch.float32)
    if kind == 'large':
        q, k, power = q * 1e4, k * 1e4, torch.full_like(power, 10.0)
    elif kind == 'small':
        q, k = q * 1e-3, k * 1e-3
    elif kind == 'zero_keys':
        k[-1, 0] = 0
    elif kind == 'one_sign_keys':
        k = torch.where(k > 0, k * 2, k * 0.1)
    elif kind == 'zero_queries':
        q[..., ::5] = 0
    elif kind == 'spread_rows':
        q = q * torch.logspace(-3, 1, N).view(1, 1, 1, N)
    return q, k, v, power


@pytest.mark.parametrize('size', [(2, 3, 37, 23, 8), (1, 2, 256, 64, 32), (2, 1, 1024, 1024, 64)])
@pytest.mark.parametrize(
    'kind',
    ['plain', 'large', 'small', 'zero_keys', 'one_sign_keys', 'zero_queries', 'spread_rows'])
def test_float32_within_the_export_tolerance_of_the_plain_formulation(size, kind):
    """The per-channel shifts (folded into the (d, d) weights) keep float32 within 1e-4 of
    the plain formulation in float64 (max difference over the output's peak), at three
    sizes and on the edge cases of the shifts; every entry is finite."""
    q, k, v, power = _edge_inputs(kind, *size)
    got = pola_linear_attention_channels_first(q, k, v, power, 4.0, 1e-6)
    want = _plain(*(t.double() for t in (q, k, v, power)), 4.0, 1e-6)
    assert torch.isfinite(got).all()
    peak = float(want.abs().max())
    if kind == 'zero_keys':  # the head with zero keys: 0 / (0 + eps) in both
        assert peak > 0 and float(got[-1, 0].abs().max()) < 1e-30
    assert float((got.double() - want).abs().max()) <= 1e-4 * peak


@pytest.mark.parametrize('d', [64, 32, 12, 7, 1])
def test_channel_max_is_the_largest_entry_of_every_token(d):
    """The two-step reduction over the channels (the form onnxruntime runs fastest) gives
    exactly the one-step one, for a head width with divisors or without."""
    x = torch.randn(2, 3, d, 11)
    x[0, 1, d // 2, 4] = float('inf')
    assert torch.equal(channel_max(x, d), x.max(dim=-2, keepdim=True)[0])


@pytest.mark.parametrize('capture', [False, True])
def test_key_shift_divided_before_the_resize_equals_the_resized_encoding(capture):
    """``P / softplus(scale)`` on P's own grid, then resized channels first (the export's
    form: parameters alone before the resize), equals ``P`` resized as tokens (the stage's
    encodings), then divided; also where the grids agree and under a graph capture (which
    records the resize at every grid)."""
    torch.manual_seed(0)
    module = PolaLinearAttention(16, 2, (5, 6))
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    scale = torch.nn.functional.softplus(module.scale).view(16, 1)
    for hw in [(5, 6), (9, 13), (3, 2), (1, 1)]:
        resized = resize_token_grid(module.positional_encoding, (5, 6), hw, mode='bicubic')
        want = module.key_shift_channels_first(resized, hw, scale)
        with torch.no_grad(), (exportable() if capture else contextlib.nullcontext()):
            got = module.key_shift_channels_first(None, hw, scale)
            plain = resize_channels_first(module.positional_encoding[0].t(), (5, 6), hw, 'bicubic')
        assert got.shape == (16, hw[0] * hw[1])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(plain, resized[0].t(), rtol=1e-5, atol=1e-6)
