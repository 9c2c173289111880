#!/usr/bin/env python
"""Benchmark the polarity-aware attention maths: our fast path (one power of |x|, one
GEMM for both streams) against the form the official code uses (relu(x)^p and relu(-x)^p
separately, each stream its own K^T v and normaliser: DESIGN.md section 1, steps 6-11,
as written), and against explicit N x n weights where that fits.

    python tools/analysis_tools/benchmark_pola_attention.py [--device cuda] [--repeat 5]

Prints one table row per shape: median forward and forward+backward milliseconds, the
ratio official-form / fast, and on CUDA the peak memory of forward+backward.
"""
import argparse
import statistics
import time

import torch

from polaformer_mm.ops import (pola_linear_attention,
                               pola_linear_attention_reference)

# (name, B, heads, N queries, n keys, head width)
SHAPES = [
    ('PVT-T stage1 224', 1, 1, 3136, 3136, 64),
    ('PVT-T stage1 512x512', 2, 1, 16384, 16384, 64),
    ('PVT-T stage1 800x1333', 2, 1, 66800, 66800, 64),
    ('PVT-T stage3 800x1333', 2, 5, 4200, 4200, 64),
    ('Swin-T stage1 800x1333', 2, 3, 66800, 66800, 32),
    ('Swin-T stage2 800x1333', 2, 6, 16700, 16700, 32),
]


def official_form(q, k, v, power, alpha=4.0, eps=1e-6):
    """The official order of operations: each stream its own K^T v and normaliser."""
    p = 1 + alpha * torch.sigmoid(power)
    q_pos, q_neg = torch.relu(q)**p, torch.relu(-q)**p
    k_pos, k_neg = torch.relu(k)**p, torch.relu(-k)**p
    q_sim = torch.cat([q_pos, q_neg], dim=-1)
    q_opp = torch.cat([q_neg, q_pos], dim=-1)
    keys = torch.cat([k_pos, k_neg], dim=-1)
    n = keys.shape[-2]
    v1, v2 = torch.chunk(v, 2, dim=-1)
    k_mean = keys.mean(dim=-2, keepdim=True).transpose(-2, -1)
    outs = []
    for queries, values in ((q_sim, v1), (q_opp, v2)):
        z = 1 / (queries @ k_mean + eps)
        kv = (keys.transpose(-2, -1) * n**-0.5) @ (values * n**-0.5)
        outs.append(queries @ kv * z)
    return torch.cat(outs, dim=-1)


def _sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize()


def measure(fn, inputs, device, repeat, backward):
    times = []
    peak = None
    for i in range(repeat + 1):
        args = [t.detach().requires_grad_(backward) for t in inputs]
        if device.type == 'cuda':
            torch.cuda.reset_peak_memory_stats()
        _sync(device)
        start = time.perf_counter()
        out = fn(*args)
        if backward:
            out.sum().backward()
        _sync(device)
        if i:  # first run is warm-up
            times.append((time.perf_counter() - start) * 1e3)
        if device.type == 'cuda':
            peak = torch.cuda.max_memory_allocated() / 2**20
    return statistics.median(times), peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', default='float32', choices=['float32', 'float16'])
    parser.add_argument('--repeat', type=int, default=5)
    parser.add_argument('--reference-max-tokens', type=int, default=4096,
                        help='run the explicit N x n version only up to this N')
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    print(f'device={device} dtype={args.dtype} torch={torch.__version__} '
          f'threads={torch.get_num_threads()}')
    header = (f"{'shape':<24}{'impl':<12}{'fwd ms':>10}{'fwd+bwd ms':>12}"
              f"{'peak MiB':>10}{'vs fast':>9}")
    print(header)
    print('-' * len(header))
    g = torch.Generator().manual_seed(0)
    for name, B, h, N, n, d in SHAPES:
        inputs = [
            torch.randn(B, h, N, d, generator=g),
            torch.randn(B, h, n, d, generator=g),
            torch.randn(B, h, n, d, generator=g),
            torch.randn(1, h, 1, d, generator=g)
        ]
        inputs = [t.to(device=device, dtype=dtype) for t in inputs]
        impls = [('fast', pola_linear_attention), ('official', official_form)]
        if N <= args.reference_max_tokens:
            impls.append(('explicit', pola_linear_attention_reference))
        fast_fb = None
        for impl, fn in impls:
            fwd, _ = measure(fn, inputs, device, args.repeat, backward=False)
            fb, peak = measure(fn, inputs, device, args.repeat, backward=True)
            fast_fb = fast_fb or fb
            peak_s = f'{peak:10.1f}' if peak is not None else f"{'-':>10}"
            print(f'{name:<24}{impl:<12}{fwd:10.2f}{fb:12.2f}{peak_s}'
                  f'{fb / fast_fb:9.2f}')


if __name__ == '__main__':
    main()
