#!/usr/bin/env python
"""Benchmark the polarity-aware attention op against the official formulation.

    python tools/analysis_tools/benchmark_pola_attention.py [--device cuda] [--repeat 5]

Implementations (``polaformer_mm.ops``): ``op`` = ``pola_linear_attention`` (its
``--backend``), ``naive`` = ``pola_linear_attention_naive`` (the official code's order of
operations: ``relu(x) ** p`` and ``relu(-x) ** p`` separately, each stream its own
``K^T v`` and normaliser, autograd through everything), and up to
``--reference-max-tokens`` queries ``explicit`` = ``pola_linear_attention_reference``
(the N x n weights).

Time: forward and forward+backward (``out.sum().backward()``), median of ``--repeat``
runs after one warm-up, the implementations alternating within one process.

Peak memory of forward+backward, over the memory the inputs already use:

* CUDA: ``torch.cuda.max_memory_allocated()`` minus the allocation before the call.
* CPU: each measurement in a fresh subprocess: it builds the inputs, runs forward+backward
  once (warm-up), resets the process's peak resident set size (``/proc/self/clear_refs``),
  and reports the peak RSS of a second forward+backward minus the RSS just before it.
  glibc is told to return freed blocks to the system at once (fixed
  ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``), so freed memory is not
  counted as in use. Where the peak cannot be reset, the first call is measured against
  the peak so far. This counts everything the call touches: saved activations,
  temporaries, the output and the gradients.

Prints one row per shape and implementation, the ratios to ``op``, and per shape how
much faster ``op`` is than ``naive`` and the ratio of their peaks.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from polaformer_mm.ops import pola_linear_attention
from polaformer_mm.ops.pola_attention import triton_backend
from polaformer_mm.ops.pola_attention.reference import (pola_linear_attention_naive,
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


def _impls(backend):

    def op(q, k, v, power):
        return pola_linear_attention(q, k, v, power, backend=backend)

    return {
        'op': op,
        'naive': pola_linear_attention_naive,
        'explicit': pola_linear_attention_reference
    }


def _inputs(shape, device, dtype, seed=0):
    _, B, h, N, n, d = shape
    g = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randn(B, h, N, d, generator=g),
        torch.randn(B, h, n, d, generator=g),
        torch.randn(B, h, n, d, generator=g),
        torch.randn(1, h, 1, d, generator=g)
    ]
    return [t.to(device=device, dtype=dtype) for t in tensors]


def _sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize()


def _call(fn, inputs, device, backward):
    args = [t.detach().requires_grad_(backward) for t in inputs]
    _sync(device)
    start = time.perf_counter()
    if backward:
        fn(*args).sum().backward()
    else:
        with torch.no_grad():
            fn(*args)
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def measure_times(impls, inputs, device, repeat, backward):
    """Median milliseconds per implementation, the implementations alternating."""
    times = {name: [] for name in impls}
    for i in range(repeat + 1):
        for name, fn in impls.items():
            t = _call(fn, inputs, device, backward)
            if i:  # the first round is the warm-up
                times[name].append(t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _status_kib(key):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1])
    raise KeyError(key)


def _can_reset_peak_rss():
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        _status_kib('VmHWM')
        return True
    except (OSError, KeyError):
        return False


def _max_rss_kib():
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1024 if sys.platform == 'darwin' else rss  # bytes on macOS


def cpu_peak_child(impl, shape_index, dtype, backend):
    """In a fresh process: peak RSS increase (MiB) of one forward+backward."""
    device = torch.device('cpu')
    fn = _impls(backend)[impl]
    inputs = _inputs(SHAPES[shape_index], device, dtype)
    if _can_reset_peak_rss():
        _call(fn, inputs, device, backward=True)  # warm-up
        _can_reset_peak_rss()
        before = _status_kib('VmRSS')
        _call(fn, inputs, device, backward=True)
        peak = _status_kib('VmHWM')
    else:  # the first call of the fresh process, against its peak so far
        before = _max_rss_kib()
        _call(fn, inputs, device, backward=True)
        peak = _max_rss_kib()
    return (peak - before) / 1024


def measure_cpu_peak(impl, shape_index, args):
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_='131072', MALLOC_TRIM_THRESHOLD_='131072')
    cmd = [
        sys.executable,
        os.path.abspath(__file__), '--child', impl,
        str(shape_index), '--dtype', args.dtype, '--backend', args.backend
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f'peak-memory subprocess failed:\n{proc.stderr[-3000:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1])['peak_mib']


def measure_cuda_peak(fn, inputs, device):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    _call(fn, inputs, device, backward=True)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', default='float32', choices=['float32', 'float16'])
    parser.add_argument('--repeat', type=int, default=5, help='timed runs (>= 1)')
    parser.add_argument(
        '--backend', default='auto', choices=['auto', 'torch', 'triton'], help="the op's backend")
    parser.add_argument(
        '--shapes',
        type=int,
        nargs='+',
        default=None,
        help=f'indices into the shape list (0-{len(SHAPES) - 1}); all by '
        'default')
    parser.add_argument(
        '--reference-max-tokens',
        type=int,
        default=4096,
        help='run the explicit N x n version only up to this N')
    parser.add_argument('--no-memory', action='store_true', help='time only')
    parser.add_argument('--child', nargs=2, metavar=('IMPL', 'SHAPE'), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f'--repeat must be >= 1 (timed runs after the warm-up), got {args.repeat}')
    if args.shapes is not None:
        bad = [i for i in args.shapes if not 0 <= i < len(SHAPES)]
        if bad:
            parser.error(f'--shapes {bad}: there are {len(SHAPES)} shapes (0-{len(SHAPES) - 1})')
    if not args.child:
        _check_device_and_backend(parser, args)
    return args


def _check_device_and_backend(parser, args) -> None:
    """Before any measurement: ``--device`` names a device torch has, and ``--backend
    triton`` takes the inputs of every shape to run on it (the op's own check)."""
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        parser.error(f'--device {args.device}: {error}')
    if device.type == 'cuda' and not torch.cuda.is_available():
        parser.error(f'--device {args.device}: torch {torch.__version__} (CUDA build '
                     f'{torch.version.cuda}) sees no CUDA GPU; run with --device cpu')
    if device.type not in ('cpu', 'cuda'):
        parser.error(f'--device {args.device}: the benchmark runs on cpu or cuda')
    if args.backend != 'triton':
        return
    dtype = getattr(torch, args.dtype)
    for index in (args.shapes if args.shapes is not None else range(len(SHAPES))):
        d = SHAPES[index][-1]
        q = torch.zeros(1, 1, 4, d, device=device, dtype=dtype)
        reasons = triton_backend.unsupported_reasons(q, q, q,
                                                     torch.zeros(1, 1, 1, d, device=device))
        if reasons:
            parser.error(f'--backend triton on {device} ({args.dtype}, head width {d}): '
                         f'{"; ".join(reasons)}; run with --backend torch (or auto, which '
                         'takes the kernels where they apply)')


def main(argv=None):
    args = parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.child:
        impl, index = args.child
        print(json.dumps({'peak_mib': cpu_peak_child(impl, int(index), dtype, args.backend)}))
        return
    device = torch.device(args.device)
    print(f'device={device} dtype={args.dtype} backend={args.backend} '
          f'torch={torch.__version__} threads={torch.get_num_threads()} '
          f'repeat={args.repeat}')
    print('command: python ' + ' '.join([sys.argv[0]] + (argv or sys.argv[1:])))
    header = (f"{'shape (B, h, N, n, d)':<48}{'impl':<10}{'fwd ms':>10}{'fwd+bwd ms':>12}"
              f"{'peak MiB':>10}{'time/op':>9}{'peak/op':>9}")
    print(header)
    print('-' * len(header))
    summary = []
    for index in (args.shapes if args.shapes is not None else range(len(SHAPES))):
        shape = SHAPES[index]
        name, B, h, N, n, d = shape
        impls = _impls(args.backend)
        if N > args.reference_max_tokens:
            del impls['explicit']
        inputs = _inputs(shape, device, dtype)
        fwd = measure_times(impls, inputs, device, args.repeat, backward=False)
        fb = measure_times(impls, inputs, device, args.repeat, backward=True)
        peaks = {}
        for impl, fn in impls.items():
            if args.no_memory:
                peaks[impl] = float('nan')
            elif device.type == 'cuda':
                peaks[impl] = measure_cuda_peak(fn, inputs, device)
            else:
                peaks[impl] = measure_cpu_peak(impl, index, args)
        label = f'{name} ({B}, {h}, {N}, {n}, {d})'
        for impl in impls:
            print(f'{label:<48}{impl:<10}{fwd[impl]:10.2f}{fb[impl]:12.2f}'
                  f'{peaks[impl]:10.1f}{fb[impl] / fb["op"]:9.2f}'
                  f'{peaks[impl] / peaks["op"]:9.2f}')
        summary.append((label, fb['naive'] / fb['op'], peaks['op'] / peaks['naive']))
    print()
    print(f"{'shape':<48}{'op speed-up over naive (fwd+bwd)':>34}{'op peak / naive peak':>22}")
    for label, speedup, memory in summary:
        print(f'{label:<48}{speedup:33.2f}x{memory:22.2f}')


if __name__ == '__main__':
    main()
