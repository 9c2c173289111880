"""Where an exported backbone's time goes in onnxruntime (CPU): op type by op type and model
part by model part.

    python tools/analysis_tools/profile_onnx.py CONFIG H W [CONFIG H W ...]
        [--parts backbone|tensor] [--runs 6] [--threads N] [--opsets 11 13 17] [--top 12]
        [--work-dir DIR] [--out-md FILE] [--out-json FILE]

Every CONFIG is exported as ``tools/analysis_tools/benchmark_onnx.py`` exports it (the
part of ``--parts``: the backbone's stage maps, or the tensor part of the model; the
first opset of ``--opsets`` that has every operator of the model; the MLPs over blocks of
tokens; initial weights) and run in an onnxruntime CPU session with profiling on
(``--threads`` intra-op threads, default PyTorch's thread count): one warm-up run, then
``--runs`` runs of a (1, 3, H, W) float32 random input. Every node's time is its fastest
run (``polaformer_mm.deployment.profile``); ``Scan`` nodes are left out of the sums, their
bodies' nodes counted instead.

Per config the report has a line with the median wall time of the profiled runs and the
summed node time (profiling adds a little to every node, so that both exceed the times of
unprofiled runs: this tool says where the time goes, ``benchmark_onnx.py`` how long it
takes), then the ``--top`` op types by time (ms, share of the sum, node count), the time
by stage and kind of part (attention, MLP, norm, other) and the attention's products
(MatMul, Gemm, Conv) against its elementwise and layout nodes. With an even number of
configs, consecutive pairs (a Pola backbone and its softmax baseline) are compared: their
summed times, their ratio, and the ratio with the first's attention elementwise and
layout nodes free (a lower bound for any graph of the same products). A line above names
the versions, threads, processor and load average. ``--out-md`` / ``--out-json`` write
the report and its numbers (every node's); ``--work-dir`` keeps the .onnx files and the
traces (default: a temporary folder). The exit status is 1 when no config was profiled,
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
from polaformer_mm.deployment import benchmark, profile  # noqa: E402
from polaformer_mm.utils import output_paths  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('runs_', nargs='+', metavar='runs', help='CONFIG H W, repeated')
    parser.add_argument(
        '--parts',
        choices=('backbone', 'tensor'),
        default='backbone',
        help='what to export and profile of every config (default: backbone)')
    parser.add_argument('--runs', type=int, default=6, help='profiled runs after one warm-up')
    parser.add_argument('--top', type=int, default=12, help='op types listed (default: 12)')
    benchmark.add_run_arguments(parser, 'the .onnx files and traces', 'the report', 'the numbers')
    args = parser.parse_args(argv)
    if args.runs < 1 or args.top < 1:
        parser.error('--runs and --top must be >= 1')
    if args.threads is not None and args.threads < 1:
        parser.error('--threads must be >= 1')
    # before any export: a run must not find at its end that it cannot write
    output_paths.check_run_options(parser.error, args.runs_, args.out_md, args.out_json,
                                   args.work_dir)
    return args


def machine_line(args: argparse.Namespace, threads: int, load_before, load_after) -> str:
    """The versions, threads, processor and load average, as benchmark_onnx.py names
    them, and how the node times were taken."""
    import onnxruntime
    return (f'torch {torch.__version__}, onnxruntime {onnxruntime.__version__} ({threads} '
            f'threads), {os.cpu_count()} CPUs ({benchmark.cpu_description()}), load average '
            f'{load_before[0]:.1f} before, {load_after[0]:.1f} after; node times: the fastest '
            f'of {args.runs} profiled runs after one warm-up, Scan nodes counted by their '
            'bodies\' nodes')


def profile_all(args: argparse.Namespace, threads: int, folder: str) -> List[profile.Profile]:
    """Export and profile every CONFIG H W of the command line, one progress line each."""
    profiles = []
    count = len(args.runs_) // 3
    with benchmark.quiet_model_logs():
        for i in range(0, len(args.runs_), 3):
            config, shape = args.runs_[i], (int(args.runs_[i + 1]), int(args.runs_[i + 2]))
            print(
                f'[{i // 3 + 1}/{count}] {args.parts} of {config} at {shape[0]}x{shape[1]}',
                file=sys.stderr,
                flush=True)
            profiles.append(
                profile.profile_run(config, args.parts, shape, folder, args.runs, args.opsets,
                                    threads))
    return profiles


def main(argv: Optional[List[str]] = None) -> List[profile.Profile]:
    """Profile every run; returns one profile per config and size."""
    args = parse_args(argv)
    threads = args.threads or torch.get_num_threads()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.work_dir or tmp
        os.makedirs(folder, exist_ok=True)
        profiles = profile_all(args, threads, folder)
    header = machine_line(args, threads, load_before, os.getloadavg())
    report = profile.format_markdown(profiles, args.top)
    print(f'{header}\n\n{report}')
    command = sys.argv[1:] if argv is None else list(argv)
    if args.out_md:
        with open(args.out_md, 'w') as f:
            f.write(f'command: python tools/analysis_tools/profile_onnx.py {" ".join(command)}'
                    f'\n\n{header}\n\n{report}\n')
    if args.out_json:
        profile.write_json(
            args.out_json, profiles,
            dict(header=header, cpu=benchmark.cpu_description(), threads=threads, argv=command),
            args.top)
    return profiles


if __name__ == '__main__':
    profiles = main()
    if not any(p.error is None for p in profiles):
        print(
            f'no config was profiled: all {len(profiles)} failed (the report says why)',
            file=sys.stderr)
        sys.exit(1)
