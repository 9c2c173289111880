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


def _onnx_ops(module, x, hw, tmp_path, forms):
    """The operator types of an ONNX export of ``module(x, hw)`` (opset 11), taken inside
    ``graph_forms(module)`` or not."""
    import contextlib

    import onnx

    from polaformer_mm.utils.compat import TORCHSCRIPT_ONNX_EXPORT
    from polaformer_mm.utils.graph_forms import graph_forms

    class Call(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.attn = module

        def forward(self, tokens):
            return self.attn(tokens, hw)

    path = str(tmp_path / f'attn_{forms}.onnx')
    wrapper = Call().eval()
    with torch.no_grad(), graph_forms(wrapper) if forms else contextlib.nullcontext():
        torch.onnx.export(wrapper, (x, ), path, opset_version=11, **TORCHSCRIPT_ONNX_EXPORT)
    return {n.op_type for n in onnx.load(path).graph.node}


@pytest.mark.parametrize('family,sr', [('pvt', 2), ('swin', 1)])
def test_the_exporter_chooses_the_channels_first_form(family, sr, tmp_path):
    """The module's forward is the eager maths alone; inside ``graph_forms`` (which the
    project's exporters enter) it runs ``forward_channels_first``, whose graph has its
    projections as products ``W x^T`` (no token-row ``Gemm``) and no ``x+`` / ``x-``
    (``Relu``), and on exit its own forward again."""
    from polaformer_mm.utils.graph_forms import graph_form_of, graph_forms

    torch.manual_seed(0)
    attn = PolaLinearAttention(16, 2, pos_grid=(4, 4), sr_ratio=sr, family=family).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    x, hw = torch.randn(1, 56, 16), (7, 8)
    with torch.no_grad():
        eager = attn(x, hw)
        with graph_forms(attn) as names:
            assert names == ['']
            graph = attn(x, hw)
            torch.testing.assert_close(graph, attn.forward_channels_first(x, hw), rtol=0, atol=0)
        assert 'forward' not in attn.__dict__
        torch.testing.assert_close(attn(x, hw), eager, rtol=0, atol=0)
    assert (graph - eager).abs().max() <= 1e-4 * eager.abs().max()  # the ONNX agreement bar
    assert graph_form_of(attn) is not None
    exported = _onnx_ops(attn, x, hw, tmp_path, forms=True)
    plain = _onnx_ops(attn, x, hw, tmp_path, forms=False)
    assert {'Gemm', 'Relu'} <= plain and not {'Gemm', 'Relu'} & exported, (plain, exported)


def test_a_subclass_graph_form_is_its_own_channels_first_form():
    """The registered form calls the module's own ``forward_channels_first``: a subclass
    that overrides it (as PolaViTAttention does) records its override."""
    from polaformer_mm.utils.graph_forms import graph_forms

    calls = []

    class Logged(PolaLinearAttention):

        def forward_channels_first(self, x, hw_shape, *args, **kwargs):
            calls.append(tuple(hw_shape))
            return super().forward_channels_first(x, hw_shape, *args, **kwargs)

    attn = Logged(16, 2, pos_grid=(4, 4), family='swin').eval()
    x = torch.randn(1, 12, 16)
    with torch.no_grad():
        attn(x, (3, 4))
        assert calls == []
        with graph_forms(attn):
            attn(x, (3, 4))
    assert calls == [(3, 4)]
