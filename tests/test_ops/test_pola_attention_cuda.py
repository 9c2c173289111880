"""The attention op on a CUDA GPU: torch path and Triton kernels against the float64
reference, autocast, and the kernels against the torch path. Skipped without a GPU."""
import logging

import pytest
import torch

from polaformer_mm.ops import pola_linear_attention
from polaformer_mm.ops.pola_attention.reference import pola_linear_attention_reference
from polaformer_mm.utils.compat import triton_status
from .._cuda import CUDA

pytestmark = CUDA

HAS_TRITON = triton_status().usable
BACKENDS = [
    'torch',
    pytest.param(
        'triton', marks=pytest.mark.skipif(not HAS_TRITON, reason=str(triton_status().reason))),
]


def _inputs(B=2, h=3, N=300, n=200, d=32, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, N, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(B, h, n, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(B, h, n, d, generator=g, dtype=torch.float64)
    power = torch.randn(1, h, 1, d, generator=g, dtype=torch.float64)
    return q, k, v, power


def _run(inputs, weights, device='cuda', dtype=torch.float32, autocast=None, **kwargs):
    leaves = [t.to(device=device, dtype=dtype).requires_grad_() for t in inputs]
    with torch.autocast('cuda', dtype=autocast or torch.float16, enabled=bool(autocast)):
        out = pola_linear_attention(*leaves, **kwargs)
        (out.float() * weights.to(out.device, torch.float32)).sum().backward()
    return [out] + [t.grad for t in leaves]


def _reference(inputs, weights, **kwargs):
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = pola_linear_attention_reference(*leaves, **kwargs)
    (out * weights).sum().backward()
    return [out] + [t.grad for t in leaves]


def _assert_close(results, expected, rtol, atol_scale):
    for name, a, b in zip(('out', 'q', 'k', 'v', 'power'), results, expected):
        a = a.detach().double().cpu()
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(
            a, b, rtol=rtol, atol=atol_scale * b.abs().max().item(), msg=name)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('d', [32, 64, 7])
def test_float32_matches_the_reference(backend, d):
    inputs = _inputs(d=d)
    weights = torch.randn(inputs[0].shape, dtype=torch.float64)
    eps = torch.tensor([1e-6, 1e-2], dtype=torch.float64).reshape(2, 1, 1, 1)
    results = _run(inputs, weights, backend=backend, eps=eps.float().cuda())
    _assert_close(results, _reference(inputs, weights, eps=eps), 1e-4, 1e-5)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('amp_dtype', [torch.float16, torch.bfloat16])
def test_autocast_is_finite_and_close_to_float32(backend, amp_dtype):
    """Under autocast, with inputs whose naive relu(q) ** p overflows float16."""
    inputs = _inputs(scale=20.0)  # 20 ** 5 > 65504
    power = torch.full_like(inputs[3], 10.0)  # exponent ~5
    inputs = inputs[:3] + (power, )
    p = 1 + 4 * torch.sigmoid(power)
    assert not torch.isfinite((inputs[0].relu()**p).half()).all()  # the case is real
    weights = torch.randn(inputs[0].shape, dtype=torch.float64)
    expected = [t.double().cpu() for t in _run(inputs, weights, backend=backend)]
    results = _run(inputs, weights, backend=backend, autocast=amp_dtype)
    _assert_close(results, expected, 1e-3, 1e-4)
    # half-precision storage (what autocast'ed projections produce)
    results = _run(inputs, weights, dtype=amp_dtype, backend=backend)
    assert results[0].dtype == amp_dtype
    _assert_close(results, expected, 5e-2, 2e-2)


@pytest.mark.skipif(not HAS_TRITON, reason=str(triton_status().reason))
@pytest.mark.parametrize('shape', [(2, 1, 4097, 4097, 64), (2, 6, 1000, 999, 32),
                                   (1, 2, 33, 5000, 64), (3, 2, 17, 3, 16)])
def test_triton_matches_the_torch_path(shape):
    B, h, N, n, d = shape
    inputs = _inputs(B, h, N, n, d)
    weights = torch.randn(inputs[0].shape, dtype=torch.float64)
    expected = [t.double().cpu() for t in _run(inputs, weights, backend='torch')]
    _assert_close(_run(inputs, weights, backend='triton'), expected, 1e-4, 1e-5)


@pytest.mark.skipif(not HAS_TRITON, reason=str(triton_status().reason))
def test_the_pruning_reads_the_loaded_kernels_on_this_gpu():
    """A launch on the GPU runs the pruning: every configuration compiled for this GPU and
    loaded, its registers and local memory (the driver's 4-byte words, as bytes) read,
    and the configurations kept those the fit policy keeps."""
    from polaformer_mm.ops.pola_attention import triton_backend
    from polaformer_mm.ops.pola_attention.triton_resources import candidates
    kernels = triton_backend.kernels
    q, k, v, power = (t.float().cuda() for t in _inputs(B=1, h=2, N=77, n=65, d=48, seed=3))
    pola_linear_attention(q, k, v, power, backend='triton')
    decisions = kernels._RUNNING_GPU.decisions  # the last kernel pruned: the query pass
    assert [d.config for d in decisions] == kernels.CONFIGS['query_forward']
    limits = kernels.compat.device_limits()
    usages = [(i, d.usage) for i, d in enumerate(decisions) if d.usage is not None]
    assert usages, decisions
    for _, usage in usages:
        assert 0 < usage.registers <= 255 and usage.spill_stores % 4 == 0, usage
    kept = [i for i, d in enumerate(decisions) if d.dropped is None]
    assert kept == candidates(usages, limits), decisions


@pytest.mark.skipif(not HAS_TRITON, reason=str(triton_status().reason))
def test_auto_backend_is_triton_on_cuda():
    q, k, v, power = (t.float().cuda() for t in _inputs())
    torch.testing.assert_close(
        pola_linear_attention(q, k, v, power),
        pola_linear_attention(q, k, v, power, backend='triton'),
        rtol=0,
        atol=0)


@pytest.mark.skipif(HAS_TRITON, reason='the installed Triton is supported')
def test_unsupported_triton_takes_the_torch_path_and_names_both_versions(caplog):
    """With a Triton the kernels do not support (torch 2.1 ships 2.1.0), 'auto' runs the
    torch path on CUDA and says why once; 'triton' is an error naming both versions."""
    from mmengine.logging import MMLogger
    q, k, v, power = (t.float().cuda() for t in _inputs())
    logger = MMLogger.get_current_instance()
    logger.propagate = True
    with caplog.at_level(logging.WARNING):
        auto = pola_linear_attention(q, k, v, power)
        pola_linear_attention(q, k, v, power)
    torch.testing.assert_close(
        auto, pola_linear_attention(q, k, v, power, backend='torch'), rtol=0, atol=0)
    assert sum('backend="auto" uses the torch path' in r.getMessage() for r in caplog.records) <= 1
    with pytest.raises(RuntimeError, match=r'>= 3\.0') as info:
        pola_linear_attention(q, k, v, power, backend='triton')
    if triton_status().version:
        assert triton_status().version in str(info.value)
