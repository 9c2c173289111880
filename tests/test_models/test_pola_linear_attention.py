import pytest
import torch
import torch.nn.functional as F

from polaformer_mm.models import PolaLinearAttention
from polaformer_mm.ops.pola_attention.reference import pola_linear_attention_reference


def _randomise(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module


@pytest.mark.parametrize('family,sr', [('pvt', 1), ('pvt', 2), ('pvt', 4), ('swin', 1)])
@pytest.mark.parametrize('hw', [(8, 8), (7, 13), (1, 5), (16, 12)])
def test_any_grid(family, sr, hw):
    attn = _randomise(
        PolaLinearAttention(24, 3, pos_grid=(8 // sr, 8 // sr), sr_ratio=sr, family=family))
    x = torch.randn(2, hw[0] * hw[1], 24)
    out = attn(x, hw)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(attn.positional_encoding.grad).all()


def _reference_forward(attn, x, hw, pos):
    """The computation of docs/advanced_guides/method.md written out for the swin family,
    with the explicit-weights attention and a given positional encoding ``pos`` (1, N, C)."""
    B, N, C = x.shape
    h, d = attn.num_heads, attn.head_dims
    q, k, v, g = attn.qkvg(x).reshape(B, N, 4, C).unbind(2)
    k = k + pos
    s = F.softplus(attn.scale)
    q, k = q / s, k / s

    def split(t):
        return t.reshape(B, N, h, d).transpose(1, 2)

    out = pola_linear_attention_reference(split(q), split(k), split(v), attn.power, attn.alpha)
    out = out.transpose(1, 2).reshape(B, N, C)
    local = split(v).reshape(B * h, hw[0], hw[1], d).permute(0, 3, 1, 2)
    local = attn.dwc(local).reshape(B, C, N).transpose(1, 2)
    return attn.proj((out + local) * g)


def test_positional_encoding_as_is_on_its_grid_resized_bicubic_elsewhere():
    attn = _randomise(PolaLinearAttention(16, 2, pos_grid=(4, 6), family='swin'))
    pe = attn.positional_encoding
    with torch.no_grad():
        x = torch.randn(2, 24, 16)
        torch.testing.assert_close(attn(x, (4, 6)), _reference_forward(attn, x, (4, 6), pe))
        x = torch.randn(2, 24, 16)
        resized = F.interpolate(
            pe.reshape(1, 4, 6, 16).permute(0, 3, 1, 2), (8, 3),
            mode='bicubic',
            align_corners=False)
        expected = _reference_forward(attn, x, (8, 3), resized.flatten(2).transpose(1, 2))
        torch.testing.assert_close(attn(x, (8, 3)), expected)


def test_bad_input_is_named():
    attn = PolaLinearAttention(16, 2, pos_grid=(4, 4))
    with pytest.raises(ValueError, match=r'hw_shape \(5, 5\)'):
        attn(torch.randn(1, 16, 16), (5, 5))
    with pytest.raises(ValueError, match='not divisible'):
        PolaLinearAttention(16, 3, pos_grid=(4, 4))
    with pytest.raises(ValueError, match='sr_ratio'):
        PolaLinearAttention(16, 2, pos_grid=(4, 4), sr_ratio=2, family='swin')
