"""Checks of the Triton kernels, run by test_pola_attention_triton.py in a subprocess.

``python -m tests.test_ops._triton_worker interpret`` (with ``TRITON_INTERPRET=1``, which
must be set before Triton is imported, hence the separate process) runs every case of
:data:`CASES` through the kernels on CPU tensors and through the torch path, and prints
one JSON line: per case, the largest difference of the output and of each gradient,
relative to the largest magnitude of the torch path's. ``compile`` (without the
interpreter) runs Triton's compiler on the four kernels for an sm_90 GPU up to its GPU
dialect, which needs no GPU, and prints the kernels lowered. ``fallback`` (with
``TRITON_INTERPRET=1``) makes the kernels raise at their first launch and prints what the
dispatch did.
"""
import json
import os
import sys

import torch

# name: (B, h, N, n, d, dtype, what)
CASES = {
    'd32': (2, 2, 37, 29, 32, 'float32', ''),
    'd64_several_blocks': (1, 3, 131, 77, 64, 'float32', ''),
    'd7_odd_width': (2, 1, 20, 9, 7, 'float32', ''),
    'long_growing_keys': (2, 4, 50, 300, 32, 'float32', 'growing'),
    'tensor_eps_padded_keys': (3, 2, 19, 40, 32, 'float32', 'padded'),
    'large_magnitudes': (1, 2, 33, 21, 32, 'float32', 'large'),
    'exact_zeros': (2, 2, 17, 23, 32, 'float32', 'zeros'),
    'subnormal_inputs': (2, 2, 21, 19, 32, 'float32', 'subnormal'),
    'large_query_meets_zero_keys': (1, 2, 9, 12, 32, 'float32', 'meet_zero'),
    'strided_layout': (2, 3, 25, 25, 32, 'float32', 'strided'),
    'float16_storage': (2, 2, 37, 29, 32, 'float16', ''),
    'bfloat16_storage': (2, 2, 37, 29, 64, 'bfloat16', ''),
    'largest_alpha_one_sign_keys': (2, 2, 40, 30, 32, 'float32', 'one_sign'),
    'no_queries': (2, 2, 0, 30, 32, 'float32', ''),
}

#: alpha per kind of case (default 4)
ALPHAS = {'one_sign': 100.0}


def _case_inputs(B, h, N, n, d, dtype, what):
    g = torch.Generator().manual_seed(B * 1000 + N * 10 + d)
    q = torch.randn(B, h, N, d, generator=g)
    k = torch.randn(B, h, n, d, generator=g)
    v = torch.randn(B, h, n, d, generator=g)
    power = torch.randn(1, h, 1, d, generator=g)
    eps = 1e-6
    if what == 'padded':
        n_real = torch.tensor([5, 40, 23])[:B]
        keep = (torch.arange(n) < n_real[:, None]).reshape(B, 1, n, 1)
        k, v = k * keep, v * keep
        eps = (1e-2 * n_real / n).reshape(B, 1, 1, 1).float()
    elif what == 'large':
        q, k = q * 1e4, k * 1e4
        power = torch.full_like(power, 10.)
    elif what == 'growing':  # the running shift of a key split grows block by block
        k = k * torch.logspace(0, 3, n).reshape(1, 1, n, 1)
    elif what == 'meet_zero':  # 0 / (0 + eps) with large shifts: eps must not underflow
        q, k = q * 1e4, k * 1e4
        power = torch.full_like(power, 10.)
        q[..., 0, 1:] = 0
        k[..., 0] = 0
    elif what == 'one_sign':  # negative queries, keys of that sign far weaker: the
        q = -q.abs() * 3  # same-signed stream lies far below the shared shifts
        k = torch.where(k > 0, k * 3, k * 0.03)
    elif what == 'zeros':
        q[..., ::3] = 0
        q[:, :, 0] = 0
        k[:, :, 1::2, 1] = 0
        k[1, 0] = 0
    elif what == 'subnormal':  # float32 subnormals scattered over q and k
        from polaformer_mm.ops.pola_attention.selfcheck import with_subnormals
        q, k = with_subnormals(q, 1), with_subnormals(k, 2)
    elif what == 'strided':  # heads split from (B, N, h*d) tokens, as the models do
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
        k = k.transpose(1, 2).contiguous().transpose(1, 2)
        v = v.transpose(1, 2).contiguous().transpose(1, 2)
    dt = getattr(torch, dtype)
    return [t.to(dt) for t in (q, k, v)] + [power], eps


def _run(q, k, v, power, eps, grad, backend, alpha=4.0):
    from polaformer_mm.ops import pola_linear_attention
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, power)]
    out = pola_linear_attention(*leaves, alpha=alpha, eps=eps, backend=backend)
    out.backward(grad)
    return [out] + [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves]


def run_case(B, h, N, n, d, dtype, what):
    (q, k, v, power), eps = _case_inputs(B, h, N, n, d, dtype, what)
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(q.shape, generator=g).to(q.dtype)
    if what == 'strided':
        grad = grad.transpose(1, 2).contiguous().transpose(1, 2)
    alpha = ALPHAS.get(what, 4.0)
    tri = _run(q, k, v, power, eps, grad, 'triton', alpha)
    ref = _run(q, k, v, power, eps, grad, 'torch', alpha)
    names = ['out', 'q', 'k', 'v', 'power']
    result = {
        'dtype': str(tri[0].dtype),
        'out_stride': list(tri[0].stride()),
        'q_stride': list(q.stride())
    }
    for name, a, b in zip(names, tri, ref):
        a, b = a.double(), b.double()
        result[name] = {
            'shape': list(a.shape),
            'finite': bool(torch.isfinite(a).all()),
            'rel_err': float(
                (a - b).abs().max() / b.abs().max().clamp_min(1e-30)) if a.numel() else 0.0,
            'max_abs': float(a.abs().max()) if a.numel() else 0.0,
        }
    if what == 'one_sign':  # the kernels' forward says so, and the result is exact
        from polaformer_mm.ops.pola_attention import triton_backend
        _, rows_lost = triton_backend.pola_linear_attention_triton(q, k, v, power, alpha, eps)
        result['shared_shifts_lose_rows'] = rows_lost
        exact = _run(*(t.double() for t in (q, k, v, power)), eps, grad.double(), 'torch', alpha)[0]
        result['exact_abs_err'] = float((tri[0].double() - exact).abs().max())
    if what == 'padded':  # and the torch path on the real keys alone
        real = []
        for b_ in range(B):
            keep = k[b_, 0].abs().sum(-1) > 0
            real.append(
                _run(q[b_:b_ + 1], k[b_:b_ + 1, :, keep], v[b_:b_ + 1, :, keep], power, 1e-2,
                     grad[b_:b_ + 1], 'torch')[0])
        real = torch.cat(real).double()
        result['real_keys_rel_err'] = float((tri[0].double() - real).abs().max() / real.abs().max())
    return result


def interpret():
    assert os.environ.get('TRITON_INTERPRET') == '1', 'set TRITON_INTERPRET=1'
    torch.set_num_threads(1)
    return {name: run_case(*spec) for name, spec in CASES.items()}


def lower_for_sm90():
    """Run Triton's compiler on every kernel for an sm_90 target as far as its GPU
    dialect (TTGIR): parsing, typing, tl.dot shapes and layouts. The LLVM, PTX and ptxas
    stages (minutes for these kernels on a 2-core machine) are left out."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    from polaformer_mm.ops.pola_attention import triton_kernels as kernels
    from polaformer_mm.ops.pola_attention.triton_backend import constants

    target = GPUTarget('cuda', 90, 32)
    backend = make_backend(target)
    lowered = []
    for name, kernel in kernels.KERNELS.items():
        configs = kernels.CONFIGS[name]
        cases = [(32, 'fp32', configs[0]), (7, 'fp16', configs[0])]
        cases += [(64, 'bf16', config) for config in configs]
        for d, dtype, config in cases:
            consts = dict(constants(d, 'ieee'), **config.kwargs)
            options = backend.parse_options(
                dict(
                    num_warps=config.num_warps, num_stages=config.num_stages,
                    enable_fp_fusion=True))
            fn = kernel.fn  # the kernel under the autotuner
            src = ASTSource(fn, kernels.signature(name, dtype), constexprs=consts)
            stages = {}
            backend.add_stages(stages, options, src.language)
            context = ir.context()
            ir.load_dialects(context)
            backend.load_dialects(context)
            module = src.make_ir(target, options, backend.get_codegen_implementation(options),
                                 backend.get_module_map(), context)
            metadata = {}
            for stage in ('ttir', 'ttgir'):
                module = stages[stage](module, metadata)
            lowered.append(f'{name}[d={d},{dtype},{config}]')
    return lowered


def _rel_err(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max())


def fallback():
    """Kernels made to raise at their first launch (the autotuner's ``run`` replaced by one
    that raises Triton's ``OutOfResources``): forward in one case (head width 32), backward
    in another (width 16), through ``backend='auto'`` and a forced ``'triton'``."""
    import warnings

    from triton.runtime.errors import OutOfResources

    from polaformer_mm.ops import pola_linear_attention
    from polaformer_mm.ops.pola_attention import triton_backend
    from polaformer_mm.ops.pola_attention import triton_kernels as kernels

    assert os.environ.get('TRITON_INTERPRET') == '1', 'set TRITON_INTERPRET=1'
    torch.set_num_threads(1)
    calls = {'forward': 0, 'backward': 0, 'forward_raised': 0, 'backward_raised': 0}

    def failing(kernel, stage, fail_for_d):
        launch = kernel.run

        def run(*args, **kwargs):
            calls[stage] += 1
            named = dict(zip(kernel.arg_names, args), **kwargs)  # BLOCK_D comes by position
            if named['BLOCK_D'] == fail_for_d:
                calls[stage + '_raised'] += 1
                raise OutOfResources(233472, 232448, 'shared memory')
            return launch(*args, **kwargs)

        kernel.run = run

    failing(kernels.query_forward_kernel, 'forward', 32)
    failing(kernels.query_backward_kernel, 'backward', 16)
    result = {}
    for d in (32, 16):
        (q, k, v, power), eps = _case_inputs(2, 2, 21, 17, d, 'float32', '')
        alpha = 4.0
        inputs = [t.clone().requires_grad_() for t in (q, k, v, power)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            runs = []
            for _ in range(2):  # the second call meets the case marked as failed
                xs = [t.detach().clone().requires_grad_() for t in inputs]
                out = pola_linear_attention(*xs, alpha, eps, backend='auto')
                out.backward(torch.ones_like(out))
                runs.append([out] + [x.grad for x in xs])
        ref = [t.detach().clone().requires_grad_() for t in inputs]
        ref_out = pola_linear_attention(*ref, alpha, eps, backend='torch')
        ref_out.backward(torch.ones_like(ref_out))
        expected = [ref_out] + [x.grad for x in ref]
        try:
            pola_linear_attention(q, k, v, power, alpha, eps, backend='triton')
            forced = ''
        except Exception as error:  # noqa: BLE001
            forced = f'{type(error).__name__}: {error}'
        result[f'd{d}'] = dict(
            warnings=[str(w.message) for w in caught if w.category is RuntimeWarning],
            rel_err=[max(_rel_err(a, b) for a, b in zip(run, expected)) for run in runs],
            forced=forced,
            failed=[list(map(str, case)) for case in triton_backend.failed_cases()])
    result['calls'] = calls
    return result


if __name__ == '__main__':
    mode = sys.argv[1]
    modes = dict(interpret=interpret, compile=lower_for_sm90, fallback=fallback)
    print(json.dumps(modes[mode]()))
