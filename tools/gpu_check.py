#!/usr/bin/env python
"""GPU check: everything this project does on CUDA, in one run and one report folder.

    python tools/gpu_check.py [--out-dir DIR] [--steps smoke tests benchmark train]
                              [--train-iters 50] [--train-batch 2] [--bench-repeat 10]

(``make gpu-check`` runs it with the project's venv.) On a machine where torch sees a
CUDA GPU it runs, in order:

1. ``smoke``: ``import polaformer_mm``, then Pola-PVT-T and Pola-Swin-T forward and
   backward at 800x1333, batch 2, in float32 and under fp16 / bf16 autocast (finite);
   and which of mmengine / mmcv (its compiled ops, their CUDA build) / mmdet / mmseg are
   importable, which decides what the later steps can do;
2. ``tests``: the CUDA tests of the suite (``pytest -m cuda`` on the test files that
   have them);
3. ``benchmark``: tools/analysis_tools/benchmark_backbone.py on CUDA, Pola-PVT-T vs
   PVT-T and Pola-Swin-T vs Swin-T (the softmax baselines need mmdet), forward and train
   step, float32 / bf16 / fp16 autocast, 512x512, 800x1333 and 1024x1024, batch 2;
4. ``train``: the two quickstart configs (Mask R-CNN and Semantic FPN with Pola-PVT-nano)
   trained with ``tools/train.py --amp`` for ``--train-iters`` iterations on synthetic
   1333x800 images: the loss must be finite at every iteration and fall (mean of the
   last 10 below the mean of the first 10). Mask R-CNN needs mmdet and mmcv's CUDA ops,
   Semantic FPN mmseg and mmcv's compiled ops; without them the step is skipped with the
   reason.

It writes ``report.json`` (environment, every step's status, figures and log files),
``benchmark_backbone.{md,json,png}`` and one log per step into the report folder
(default ``work_dirs/gpu_check/<date-time>``), and prints a summary. Exit status: 0 when
no step failed (skipped steps are listed with their reason), 1 when one failed, 2
without a usable GPU. The check is ``polaformer_mm.workflows.gpu_check``'s; this script
reads the command line.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

try:
    from polaformer_mm.workflows.gpu_check import STEPS, run_gpu_check
except ImportError as e:  # torch or the stack under the package: nothing can be checked
    print(f'gpu-check: polaformer_mm does not import ({e}); nothing to check', file=sys.stderr)
    sys.exit(2)


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description='Run the CUDA tests, benchmark and AMP training '
                                'and write one report folder')
    p.add_argument('--out-dir', help='report folder (default work_dirs/gpu_check/<date-time>)')
    p.add_argument(
        '--steps',
        nargs='+',
        choices=STEPS,
        default=list(STEPS),
        help='steps to run (default: all)')
    p.add_argument('--train-iters', type=int, default=50)
    p.add_argument('--train-batch', type=int, default=2)
    p.add_argument('--bench-repeat', type=int, default=10)
    p.add_argument(
        '--step-timeout',
        type=float,
        default=1800,
        help='seconds one step (one subprocess) may take')
    args = p.parse_args(argv)
    args.python = sys.executable  # every step runs with this interpreter
    if args.train_iters < 20:
        p.error(f'--train-iters must be >= 20 to tell a falling loss, got {args.train_iters}')
    if args.train_batch < 1 or args.bench_repeat < 1:
        p.error('--train-batch and --bench-repeat must be >= 1')
    return args


def main(argv=None) -> int:
    """Run the check; returns the exit status."""
    args = parse_args(argv)
    return run_gpu_check(
        out_dir=args.out_dir,
        steps=args.steps,
        train_iters=args.train_iters,
        train_batch=args.train_batch,
        bench_repeat=args.bench_repeat,
        step_timeout=args.step_timeout,
        python=args.python)


if __name__ == '__main__':
    sys.exit(main())
