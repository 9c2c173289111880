"""polaformer_mm.utils.compat: the version shims, on whichever stack runs the tests."""
from importlib import metadata

import numpy as np
import pytest
import torch

from polaformer_mm.ops import pola_linear_attention
from polaformer_mm.utils import compat


def test_version_tuple():
    assert compat.version_tuple('2.1.2+cu121') == (2, 1, 2)
    assert compat.version_tuple('3.0.0rc1') == (3, 0, 0)
    assert compat.version_tuple(torch.__version__) == compat.TORCH_VERSION


def test_is_autocast_enabled_follows_torch_autocast():
    assert not compat.is_autocast_enabled('cpu')
    assert not compat.is_autocast_enabled('cuda')
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert compat.is_autocast_enabled('cpu')
        assert not compat.is_autocast_enabled('cuda')
    assert not compat.is_autocast_enabled('cpu')


def test_is_compiling_outside_compile():
    assert compat.is_compiling() is False


def test_numpy_multiarray_reconstructs_arrays():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    rebuilt = compat.NUMPY_MULTIARRAY._reconstruct(np.ndarray, (0, ), b'b')
    rebuilt.__setstate__(arr.__reduce__()[2])
    np.testing.assert_array_equal(rebuilt, arr)


def test_native_allowlist_only_where_tuple_entries_exist():
    assert compat.NATIVE_ALLOWLIST == (compat.TORCH_VERSION >= (2, 6))


def test_triton_status_matches_the_installed_triton():
    status = compat.triton_status()
    try:
        installed = metadata.version('triton')
    except metadata.PackageNotFoundError:
        installed = None
    if installed is None:
        assert not status.usable and 'does not import' in status.reason
        return
    assert status.version == installed
    assert status.usable == (compat.version_tuple(installed)[:2] >= compat.MIN_TRITON)
    if not status.usable:  # a Triton older than torch 2.1's 2.1.0
        assert installed in status.reason and '>= 2.1' in status.reason


@pytest.mark.skipif(compat.triton_status().usable, reason='the installed Triton is supported')
def test_backend_triton_names_both_versions_with_an_unsupported_triton():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g) for _ in range(3))
    power = torch.zeros(1, 2, 1, 8)
    with pytest.raises(RuntimeError, match=r'need Triton >= 2\.1'):
        pola_linear_attention(q, k, v, power, backend='triton')
    # 'auto' (and 'torch') work: on the CPU the torch path
    out = pola_linear_attention(q, k, v, power)
    assert out.shape == q.shape and torch.isfinite(out).all()


def test_has_fused_adamw_on_the_cpu_from_torch_2_4():
    # the probe (one fused step) agrees with the release notes: CPU kernels came in 2.4
    assert compat.has_fused_adamw('cpu') is (compat.TORCH_VERSION >= (2, 4))
    assert compat.has_fused_adamw('cuda') is (torch.cuda.is_available())


@pytest.mark.skipif(not compat.has_fused_adamw('cpu'), reason='no fused CPU AdamW in this torch')
def test_fused_adamw_takes_the_same_steps_as_foreach():
    torch.manual_seed(0)
    start = [torch.randn(5, 3), torch.randn(7)]
    runs = {}
    for kind in ('foreach', 'fused'):
        params = [p.clone().requires_grad_() for p in start]
        opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05, **{kind: True})
        for step in range(3):
            for i, p in enumerate(params):
                p.grad = torch.full_like(p, 0.1 * (step + 1) * (i + 1)) + p.detach()
            opt.step()
        runs[kind] = params
    for a, b in zip(runs['foreach'], runs['fused']):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
