"""PolaPVT and PolaSwin on CUDA: forward and backward under autocast (fp16, bf16).

* every arch (PVT tiny/small/medium/large, Swin tiny/small/base) at 800x1333: outputs
  of the right shapes, finite, close to the float32 run, and every parameter's gradient
  finite and close to float32's;
* 'L' and 'S' stages in both orders and both Swin window forms, at 800x1333 and an odd
  size, with gradient checkpointing (``with_cp``), which must give the results and
  gradients of the run without it.

Each test also has a CPU case: float32 at a small size, so the code runs everywhere;
the CUDA cases are marked ``cuda`` and skipped where torch sees no GPU.
"""
import math

import pytest
import torch

from polaformer_mm import PolaPVT, PolaSwin
from ._devices import cuda_param

BACKBONES = {'PolaPVT': PolaPVT, 'PolaSwin': PolaSwin}
ARCHS = [('PolaPVT', a) for a in ('tiny', 'small', 'medium', 'large')] + \
    [('PolaSwin', a) for a in ('tiny', 'small', 'base')]
AMP = {'float16': torch.float16, 'bfloat16': torch.bfloat16}
# relative L2 error of autocast against float32 (outputs; all gradients as one vector)
# (on the CPU's autocast: fp16 <= 0.002 / 0.005, bf16 <= 0.015 / 0.016 for these archs)
AMP_TOL = {'float16': dict(out=0.01, grad=0.02), 'bfloat16': dict(out=0.05, grad=0.06)}
LOSS_SCALE = 2.0**16
FULL = (800, 1333)
ODD = (333, 517)
CPU_SMALL = (37, 45)
CPU_ODD = (61, 83)


def _expected_shapes(model, batch, hw):
    return [(batch, c, math.ceil(hw[0] / 2**(i + 2)), math.ceil(hw[1] / 2**(i + 2)))
            for i, c in enumerate(model.num_features)]


def _build(name, device, **kwargs):
    torch.manual_seed(0)
    model = BACKBONES[name](drop_path_rate=0., **kwargs)
    model.init_weights()
    return model.to(device).train()


def _fwd_bwd(model, x, dtype):
    """Forward (under autocast when dtype is given) and backward of a fixed random linear
    function of the outputs (a loss of their squares would be constant up to rounding
    behind the output LayerNorms, leaving only rounding noise in most gradients)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
        outs = model(x)
    g = torch.Generator().manual_seed(0)
    loss = sum((o.float() * torch.randn(o.shape, generator=g).to(o.device)).mean() for o in outs)
    # scaled as mixed-precision training scales it (mmengine's AmpOptimWrapper starts at
    # 2**16): the mean over ~10**6 outputs leaves gradients near 1e-7, below float16's
    # normal range, which an unscaled float16 backward flushes towards zero
    (loss * LOSS_SCALE).backward()
    grads = {
        k: p.grad.detach() / LOSS_SCALE
        for k, p in model.named_parameters() if p.grad is not None
    }
    return [o.detach().float() for o in outs], grads


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def _flat(grads, keys):
    return torch.cat([grads[k].float().flatten() for k in keys])


def _check_finite_and_complete(model, outs, grads, batch, hw):
    assert [tuple(o.shape) for o in outs] == _expected_shapes(model, batch, hw)
    assert all(torch.isfinite(o).all() for o in outs), 'non-finite output'
    trainable = [k for k, p in model.named_parameters() if p.requires_grad]
    missing = [k for k in trainable if k not in grads]
    assert not missing, f'parameters without gradient: {missing[:10]}'
    bad = [k for k, g in grads.items() if not torch.isfinite(g).all()]
    assert not bad, f'non-finite gradients: {bad[:10]}'


# CPU: one case per distinct width / head layout (the PVT sizes differ in depth only;
# Swin-S has Swin-T's widths), shallow
CPU_ARCHS = [('PolaPVT', 'tiny', 'tiny'), ('PolaSwin', 'tiny', 'tiny'),
             ('PolaSwin', 'base-shallow',
              dict(embed_dims=128, depths=[2, 2, 2, 2], num_heads=[4, 8, 16, 32]))]


def _arch_cases():
    cases = [
        pytest.param('cpu', name, arch, None, id=f'cpu-{name}-{tag}-float32')
        for name, tag, arch in CPU_ARCHS
    ]
    for name, arch in ARCHS:
        for amp in AMP:
            cases.append(cuda_param('cuda', name, arch, amp, id=f'cuda-{name}-{arch}-{amp}'))
    return cases


@pytest.mark.parametrize('device,name,arch,amp', _arch_cases())
def test_arch_forward_backward_autocast(device, name, arch, amp):
    batch, hw = (1, FULL) if device == 'cuda' else (2, CPU_SMALL)
    model = _build(name, device, arch=arch)
    x = torch.randn(batch, 3, *hw, device=device, generator=None)
    ref_outs, ref_grads = _fwd_bwd(model, x, None)
    _check_finite_and_complete(model, ref_outs, ref_grads, batch, hw)
    if amp is None:
        return
    outs, grads = _fwd_bwd(model, x, AMP[amp])
    _check_finite_and_complete(model, outs, grads, batch, hw)
    tol = AMP_TOL[amp]
    errs = [_rel(o, r) for o, r in zip(outs, ref_outs)]
    assert max(errs) < tol['out'], f'{amp} outputs differ from float32 by {errs}'
    keys = sorted(ref_grads)
    err = _rel(_flat(grads, keys), _flat(ref_grads, keys))
    assert err < tol['grad'], f'{amp} gradients differ from float32 by {err:.3g}'


def _stage_cases():
    kinds = [('PolaPVT', 'LLSS', {}), ('PolaPVT', 'SSLL', {})]
    # both window forms of the 'L' stages: windows of 56x56 tokens and the whole map
    swin_forms = [dict(linear_window_size=56), dict(linear_window_size=None)]
    for attn_types in ('LLSS', 'SSLL'):
        for extra in swin_forms:
            kinds.append(('PolaSwin', attn_types, extra))
    cases = []
    for name, attn_types, extra in kinds:
        tag = f'{name}-{attn_types}' + ''.join(f'-{k}={v}' for k, v in extra.items())
        cases.append(
            pytest.param(
                'cpu',
                name,
                attn_types,
                extra,
                CPU_ODD,
                None,
                id=f'cpu-{tag}-{CPU_ODD[0]}x{CPU_ODD[1]}-float32'))
        for hw in (FULL, ODD):
            for amp in AMP:
                cases.append(
                    cuda_param(
                        'cuda',
                        name,
                        attn_types,
                        extra,
                        hw,
                        amp,
                        id=f'cuda-{tag}-{hw[0]}x{hw[1]}-{amp}'))
    return cases


@pytest.mark.parametrize('device,name,attn_types,extra,hw,amp', _stage_cases())
def test_stage_kinds_with_checkpointing(device, name, attn_types, extra, hw, amp):
    dtype = AMP[amp] if amp else None
    plain = _build(name, device, arch='tiny', attn_types=attn_types, **extra)
    ckpt = _build(name, device, arch='tiny', attn_types=attn_types, with_cp=True, **extra)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, *hw, device=device)
    outs, grads = _fwd_bwd(plain, x, dtype)
    cp_outs, cp_grads = _fwd_bwd(ckpt, x, dtype)
    _check_finite_and_complete(plain, outs, grads, 1, hw)
    _check_finite_and_complete(ckpt, cp_outs, cp_grads, 1, hw)
    assert sorted(grads) == sorted(cp_grads)
    # recomputation runs the same kernels on the same inputs; only the order of
    # gradient accumulation may differ
    out_tol, grad_tol = (1e-5, 1e-4) if dtype is None else (1e-3, 1e-2)
    errs = [_rel(a, b) for a, b in zip(cp_outs, outs)]
    assert max(errs) < out_tol, f'with_cp changed the outputs: {errs}'
    keys = sorted(grads)
    err = _rel(_flat(cp_grads, keys), _flat(grads, keys))
    assert err < grad_tol, f'with_cp changed the gradients by {err:.3g}'
