"""Checks of the Triton kernels, run by test_pola_attention_triton.py in a subprocess.

``python -m tests.test_ops._triton_worker interpret`` (with ``TRITON_INTERPRET=1``, which
must be set before Triton is imported, hence the separate process) runs every case of
:data:`CASES` through the kernels on CPU tensors and through the torch path, and prints
one JSON line: per case, the largest difference of the output and of each gradient,
relative to the largest magnitude of the torch path's. ``compile`` (without the
interpreter) compiles the four kernels for an sm_90 GPU with Triton's own ptxas, which
needs no GPU, and prints the kernels compiled.
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
    'strided_layout': (2, 3, 25, 25, 32, 'float32', 'strided'),
    'float16_storage': (2, 2, 37, 29, 32, 'float16', ''),
    'bfloat16_storage': (2, 2, 37, 29, 64, 'bfloat16', ''),
}


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
    elif what == 'zeros':
        q[..., ::3] = 0
        q[:, :, 0] = 0
        k[:, :, 1::2, 1] = 0
        k[1, 0] = 0
    elif what == 'strided':  # heads split from (B, N, h*d) tokens, as the models do
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
        k = k.transpose(1, 2).contiguous().transpose(1, 2)
        v = v.transpose(1, 2).contiguous().transpose(1, 2)
    dt = getattr(torch, dtype)
    return [t.to(dt) for t in (q, k, v)] + [power], eps


def _run(q, k, v, power, eps, grad, backend):
    from polaformer_mm.ops import pola_linear_attention
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, power)]
    out = pola_linear_attention(*leaves, eps=eps, backend=backend)
    out.backward(grad)
    return [out] + [t.grad for t in leaves]


def run_case(B, h, N, n, d, dtype, what):
    (q, k, v, power), eps = _case_inputs(B, h, N, n, d, dtype, what)
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(q.shape, generator=g).to(q.dtype)
    if what == 'strided':
        grad = grad.transpose(1, 2).contiguous().transpose(1, 2)
    tri = _run(q, k, v, power, eps, grad, 'triton')
    ref = _run(q, k, v, power, eps, grad, 'torch')
    names = ['out', 'q', 'k', 'v', 'power']
    result = {'dtype': str(tri[0].dtype), 'out_stride': list(tri[0].stride()),
              'q_stride': list(q.stride())}
    for name, a, b in zip(names, tri, ref):
        a, b = a.double(), b.double()
        result[name] = {
            'finite': bool(torch.isfinite(a).all()),
            'rel_err': float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)),
        }
    if what == 'padded':  # and the torch path on the real keys alone
        real = []
        for b_ in range(B):
            keep = k[b_, 0].abs().sum(-1) > 0
            real.append(
                _run(q[b_:b_ + 1], k[b_:b_ + 1, :, keep], v[b_:b_ + 1, :, keep], power,
                     1e-2, grad[b_:b_ + 1], 'torch')[0])
        real = torch.cat(real).double()
        result['real_keys_rel_err'] = float(
            (tri[0].double() - real).abs().max() / real.abs().max())
    return result


def interpret():
    assert os.environ.get('TRITON_INTERPRET') == '1', 'set TRITON_INTERPRET=1'
    torch.set_num_threads(1)
    return {name: run_case(*spec) for name, spec in CASES.items()}


def compile_for_sm90():
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from polaformer_mm.ops import _pola_triton_kernels as kernels
    from polaformer_mm.ops.pola_attention_triton import _launch_config

    pointer_args = {
        '_key_summary_kernel': dict(K='x', V='x', P='f', KV='f', KMEAN='f', KMAX='f'),
        '_query_forward_kernel': dict(Q='x', W='f', P='f', EPS='f', KMAX='f', OUT='x'),
        '_query_backward_kernel': dict(Q='x', GO='x', W='f', P='f', EPS='f', KMAX='f',
                                       GQ='x', GW='f', GP='f'),
        '_key_backward_kernel': dict(K='x', V='x', P='f', KMAX='f', GKV='f', GMEAN='f',
                                     GK='x', GV='x', GP='f'),
    }
    compiled = []
    for d, dtype in ((64, 'bf16'), ):
        block_n, block_d, num_warps = _launch_config(d)
        constants = dict(BLOCK_N=block_n, BLOCK_D=block_d, PRECISION='ieee',
                         TINY=float(torch.finfo(torch.float32).tiny))
        for name, pointers in pointer_args.items():
            fn = getattr(kernels, name)
            signature = {}
            for arg in fn.arg_names:
                if arg in constants:
                    signature[arg] = 'constexpr'
                elif arg in pointers:
                    signature[arg] = '*' + (dtype if pointers[arg] == 'x' else 'fp32')
                else:
                    signature[arg] = 'i32'
            triton.compile(
                ASTSource(fn, signature, constexprs=constants),
                target=GPUTarget('cuda', 90, 32),
                options=dict(num_warps=num_warps, enable_fp_fusion=True))
            compiled.append(f'{name}[d={d},{dtype}]')
    return compiled


if __name__ == '__main__':
    mode = sys.argv[1]
    result = interpret() if mode == 'interpret' else compile_for_sm90()
    print(json.dumps(result))
