#!/usr/bin/env python
"""Compile the fused Triton kernels for named GPU targets, without a GPU, and say what each
variant uses: registers, spills and shared memory, and whether it fits the target.

    python tools/analysis_tools/compile_kernels.py [--targets 80 86 89 90]
        [--dtypes float32 float16 bfloat16] [--precisions ieee tf32] [--head-dims 32 64 128]
        [--kernels NAME ...] [--jobs N] [--json PATH] [--out-md PATH] [--details] [--quiet]

Every kernel x target x autotune configuration x storage dtype x torch ``allow_tf32``
setting (``ieee``: False, ``tf32``: True) x head width is compiled through Triton's own
compile path and assembled by its bundled ``ptxas`` (one to a few seconds per variant and
process; ``--jobs`` runs several; progress on stderr unless ``--quiet``). Printed: per case
(kernel, target, dtype, allow_tf32, head width) one Markdown row: how many configurations fit
the target / fit without spill stores / were compiled, the registers and shared memory of the
configurations the autotuner keeps, the largest spill of any configuration and those
configurations; with ``--details`` also one row per variant. ``--json`` writes both,
``--out-md`` the printed Markdown. The exit status is 1 when a variant failed to compile or a
case has no configuration that fits. The report is
``polaformer_mm.ops.pola_attention.compile_report``'s.
"""
import argparse
import json
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from polaformer_mm.ops.pola_attention import compile_report as cr  # noqa: E402
from polaformer_mm.utils import output_paths  # noqa: E402


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        description='Compile the fused Triton kernels for GPU targets without a GPU')
    p.add_argument(
        '--targets',
        nargs='+',
        default=[str(t) for t in cr.DEFAULT_TARGETS],
        help='compute capabilities: 80 or sm_80 (default: %(default)s)')
    p.add_argument(
        '--dtypes',
        nargs='+',
        default=list(cr.DEFAULT_DTYPES),
        choices=cr.DEFAULT_DTYPES,
        help='storage dtypes (default: all)')
    p.add_argument(
        '--precisions',
        nargs='+',
        default=list(cr.DEFAULT_PRECISIONS),
        choices=cr.DEFAULT_PRECISIONS,
        help="torch allow_tf32: 'ieee' is False, 'tf32' is True (default: both)")
    p.add_argument(
        '--head-dims',
        nargs='+',
        type=int,
        default=list(cr.DEFAULT_HEAD_DIMS),
        help='head widths (default: %(default)s)')
    p.add_argument('--kernels', nargs='+', help='kernel names (default: every kernel)')
    p.add_argument('--jobs', type=int, default=1, help='compiler processes (default: 1)')
    p.add_argument('--json', metavar='PATH', help='write every variant and case as JSON')
    p.add_argument('--out-md', metavar='PATH', help='write the printed Markdown')
    p.add_argument('--details', action='store_true', help='also print one row per variant')
    p.add_argument('--quiet', action='store_true', help='no progress lines (every 25 compilations)')
    return p.parse_args(argv)


def _check_outputs(args) -> None:
    """Fail before compiling when ``--json`` / ``--out-md`` cannot be written (a file is
    created and removed where each is named) or both name the same file."""
    try:
        output_paths.check_output_files({'--json': args.json, '--out-md': args.out_md})
    except output_paths.OutputPathError as error:
        raise SystemExit(f'compile_kernels: {error}')


def _progress(done: int, total: int) -> None:
    if done == total or done % 25 == 0:
        print(f'compiled {done}/{total}', file=sys.stderr, flush=True)


def main(argv=None):
    """Compile, print the tables (and write them); returns the report and the exit status."""
    args = parse_args(argv)
    _check_outputs(args)
    try:
        targets = [cr.parse_target(t) for t in args.targets]
        report = cr.compile_report(
            targets=targets,
            dtypes=args.dtypes,
            precisions=args.precisions,
            head_dims=args.head_dims,
            kernels=args.kernels,
            jobs=args.jobs,
            progress=None if args.quiet else _progress)
    except (ValueError, cr.CompileReportUnavailable) as error:
        raise SystemExit(f'compile_kernels: {error}')
    text = cr.summary_table(report)
    if args.details:
        text += '\n\n' + cr.variant_table(report)
    problems = [
        f'{v.case.kernel} sm_{v.case.target} {v.case.dtype} {v.case.tf32} d={v.case.head_dim} '
        f'{cr.config_label(v)}: {v.error}' for v in report.failed
    ] + [
        f'{s.case.kernel} sm_{s.case.target} {s.case.dtype} {s.case.tf32} '
        f'd={s.case.head_dim}: no configuration fits' for s in report.unfit_cases
    ]
    print(text)
    if args.out_md:
        with open(args.out_md, 'w') as f:
            f.write(text + '\n')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(report.as_dict(), f, indent=1)
    for problem in problems:
        print(f'FAILED {problem}', file=sys.stderr)
    return report, int(bool(problems))


if __name__ == '__main__':
    sys.exit(main()[1])
