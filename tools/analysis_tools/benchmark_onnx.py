"""onnxruntime (CPU) against PyTorch eager: median seconds per image of exported models.

    python tools/analysis_tools/benchmark_onnx.py CONFIG H W [CONFIG H W ...]
        [--parts backbone end2end] [--repeats 10] [--warmup 2] [--rounds 1]
        [--opsets 11 13 17] [--threads N] [--no-block-mlps] [--roofline] [--work-dir DIR]
        [--out-md FILE] [--out-json FILE]

Every CONFIG is exported as ``tools/deployment/pytorch2onnx.py`` exports it, once per part
of ``--parts`` (initial weights: the speed does not depend on them):

* ``backbone``: the backbone's stage maps (``--backbone-only``);
* ``tensor``: the tensor part of the model, no post-processing (``--tensor-only``);
* ``end2end``: the whole detector / segmentor with its post-processing, through mmdeploy
  (the default export); PyTorch runs ``model.predict`` on the same preprocessed input.

Pola models and softmax baselines alike: each export takes the first opset of
``--opsets`` that has every operator of the model (mmdet's PVT needs 13 for
``aten::unflatten``), named in the table. A config that fails to export or run gives a
row with the reason, and the table goes on.

Every export is made first; then both runtimes run one (1, 3, H, W) image at a time on
this machine, in this one process, PyTorch with its default thread count and onnxruntime
with ``--threads`` (default: the same count), ``--repeats`` timed calls of each (PyTorch's
first) after ``--warmup`` untimed ones, row after row. ``--rounds R`` times all rows R
times over (the same onnxruntime sessions) and takes the medians of all R x ``--repeats``
calls, so that a machine whose speed drifts during the run moves every row alike and the
ratios between rows (a Pola backbone against its softmax baseline) hold; PyTorch eager's
times in such a run have come out higher than in a run without rounds (the deployment
guide, "Speed"), so the PyTorch / onnxruntime ratio is best read from a run without them.
The medians are printed as a Markdown table with the PyTorch / onnxruntime ratio, under a
line naming the versions, the threads, the processor (its model and widest vector
extension: which runtime is faster depends on it) and the load average (before and
after), which says how quiet the machine was. The exports run their transformer MLPs
over blocks of tokens (``polaformer_mm.deployment.blocked_mlp``) as every export of the
project does; ``--no-block-mlps`` times the graphs as traced instead. One progress line
per export (and one per round) goes to stderr; the models' logs are kept at warning
level. ``--roofline`` adds three columns: each row's FLOPs (multiply-adds, counted as
``tools/analysis_tools/get_flops.py`` counts them: the backbone, or the tensor-only forward
for ``--parts tensor``; not for ``end2end``), the rate onnxruntime ran it at (GFLOP/s, two
per multiply-add, over the median time) and that rate's fraction of this machine's float32
matrix-product peak, measured in the same run with the rows' session options and threads
(a one-node ``MatMul`` of two 1024x1024 matrices, median of 5 runs), named under the
table. ``--out-md`` / ``--out-json`` write the table and its rows; they, and
``--work-dir``, are checked before the first export (a path that cannot be written is a
usage error). The exit status is 1 when no row was timed (every export or run failed),
else 0.
"""
import argparse
import os
import os.path as osp
import sys
import tempfile
from typing import List, Optional

import torch

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..', '..')))
from polaformer_mm.deployment import benchmark, mmdeploy_missing  # noqa: E402
from polaformer_mm.utils import output_paths  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('runs', nargs='+', help='CONFIG H W, repeated')
    parser.add_argument(
        '--parts',
        nargs='+',
        choices=benchmark.PARTS,
        default=['backbone', 'end2end'],
        help='what to export and time of every config (default: backbone end2end)')
    parser.add_argument('--repeats', type=int, default=10, help='timed runs per model')
    parser.add_argument('--warmup', type=int, default=2, help='untimed runs before them')
    parser.add_argument(
        '--rounds',
        type=int,
        default=1,
        help='time all rows this many times over; the medians are of all rounds (default: 1)')
    parser.add_argument(
        '--no-block-mlps',
        action='store_true',
        help='export the MLPs as traced, not over blocks of tokens (the rewrite every export '
        'applies by default)')
    parser.add_argument(
        '--roofline',
        action='store_true',
        help="add each row's counted FLOPs, its onnxruntime GFLOP/s and their fraction of this "
        "machine's float32 matrix-product peak (backbone and tensor parts)")
    benchmark.add_run_arguments(parser, 'the .onnx files', 'the table', 'the rows')
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error('--repeats and --rounds must be >= 1 and --warmup >= 0')
    if args.threads is not None and args.threads < 1:
        parser.error('--threads must be >= 1')
    if args.roofline and 'end2end' in args.parts:
        parser.error('--roofline counts the FLOPs of the backbone and tensor parts: drop end2end '
                     'from --parts (its post-processing has no count)')
    # before any export: a run must not find at its end that it cannot write
    output_paths.check_run_options(parser.error, args.runs, args.out_md, args.out_json,
                                   args.work_dir)
    return args


def _header(args, threads: int, load_before, load_after) -> str:
    import onnxruntime
    return (f'torch {torch.__version__} ({torch.get_num_threads()} threads), onnxruntime '
            f'{onnxruntime.__version__} ({threads} threads), {os.cpu_count()} CPUs '
            f'({benchmark.cpu_description()}), load average {load_before[0]:.1f} before, '
            f'{load_after[0]:.1f} after; {_runs(args)}; MLPs '
            f'{"as traced" if args.no_block_mlps else "over blocks of tokens"}')


def _runs(args) -> str:
    """How the medians were taken, for the header."""
    if args.rounds == 1:
        return f'median of {args.repeats} runs after {args.warmup} untimed'
    return (f'median of {args.rounds * args.repeats} runs ({args.rounds} rounds over all rows '
            f'of {args.repeats} runs after {args.warmup} untimed)')


def main(argv: Optional[List[str]] = None) -> List[benchmark.BenchmarkRow]:
    """Time every run; returns one row per config, size and part."""
    args = parse_args(argv)
    if 'end2end' in args.parts:
        missing = mmdeploy_missing()
        if missing:
            raise SystemExit(f'{missing}; --parts backbone tensor times the parts without it')
    threads = args.threads or torch.get_num_threads()
    load_before = os.getloadavg()
    prepared, configs = [], []
    with tempfile.TemporaryDirectory() as tmp, benchmark.quiet_model_logs():
        folder = args.work_dir or tmp
        os.makedirs(folder, exist_ok=True)
        for i in range(0, len(args.runs), 3):
            config, shape = args.runs[i], (int(args.runs[i + 1]), int(args.runs[i + 2]))
            for part in args.parts:
                print(
                    f'[{len(prepared) + 1}/{len(args.runs) // 3 * len(args.parts)}] {part} of '
                    f'{config} at {shape[0]}x{shape[1]}',
                    file=sys.stderr,
                    flush=True)
                configs.append(config)
                prepared.append(
                    benchmark.prepare_run(config, part, shape, folder, args.opsets, threads,
                                          not args.no_block_mlps))
        rows = benchmark.time_prepared(
            prepared,
            args.repeats,
            args.warmup,
            args.rounds,
            progress=None if args.rounds == 1 else
            lambda r: print(f'timing, round {r}/{args.rounds}', file=sys.stderr, flush=True))
        peak = None
        if args.roofline:
            print('roofline: counting FLOPs, timing the matrix-product peak', file=sys.stderr)
            rows = benchmark.with_flops(rows, configs)
            peak = benchmark.matmul_peak(threads)
    header = _header(args, threads, load_before, os.getloadavg())
    table = benchmark.format_markdown(rows, peak)
    print(f'{header}\n\n{table}')
    if args.out_md:
        with open(args.out_md, 'w') as f:
            f.write(f'command: python tools/analysis_tools/benchmark_onnx.py '
                    f'{" ".join(sys.argv[1:] if argv is None else argv)}\n\n{header}\n\n'
                    f'{table}\n')
    if args.out_json:
        benchmark.write_json(
            args.out_json, rows,
            dict(
                header=header,
                cpu=benchmark.cpu_description(),
                argv=sys.argv[1:] if argv is None else argv), peak)
    return rows


if __name__ == '__main__':
    rows = main()
    status = benchmark.exit_code(rows)
    if status:
        print(f'no row was timed: all {len(rows)} failed (the table says why)', file=sys.stderr)
    sys.exit(status)
