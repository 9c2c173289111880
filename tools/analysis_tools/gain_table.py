#!/usr/bin/env python
"""The Pola vs softmax table of finished runs, paper style: Markdown, CSV and a bar chart.

    python tools/analysis_tools/gain_table.py WORK_DIR [WORK_DIR ...] [--out PREFIX]
        [--no-flops] [--flops-cache FILE] [--threads N]

A WORK_DIR is the work dir of one run (``tools/reproduce.py`` uses
``WORK_ROOT/<config name>``) or a folder holding such run dirs. A run's results are the
``test_metrics.json`` files that ``tools/test.py`` writes into its ``--work-dir``, looked
for in each WORK_DIR and up to two folder levels below it (``reproduce.py`` tests into
``<run>/test`` and, with ``--tta``, ``<run>/test_tta``); each file names the config and
checkpoint it tested and whether it used test-time augmentation. When several files
describe the same kind of test, the newest counts.

Rows: every run, grouped by model, dataset and schedule; a Pola run and its softmax
baseline (the same config name without ``pola-``, the naming of ``configs/``) are paired
and followed by a delta row (Pola - softmax). Columns: backbone, params (M) and FLOPs (G)
of the backbone alone, measured with ``get_flops.py`` at the task's standard input size
(mmdet configs 800x1333, mmseg 512x512) with the config the run was tested with,
schedule, and the metrics: detection AP^b, AP^b_50, AP^b_75 and AP^m (COCO AP x 100,
single scale); segmentation mIoU (single scale) and mIoU(ms+flip) (the ``--tta`` test).

``--out PREFIX`` writes ``PREFIX.md``, ``PREFIX.csv`` and ``PREFIX.png`` (a bar chart of
the deltas; matplotlib, Agg backend); the Markdown is printed in any case. ``--out`` and
``--flops-cache`` are checked before any run is read (each file writable where it is named,
no two the same); the cache is rewritten whole after every measurement. The table is
``polaformer_mm.analysis.gain_table``'s.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from polaformer_mm.analysis.gain_table import check_outputs, make_gain_table  # noqa: E402
from polaformer_mm.utils.output_paths import OutputPathError  # noqa: E402


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description='Pola vs softmax table of evaluated runs')
    p.add_argument(
        'work_dirs', nargs='+', metavar='WORK_DIR', help='run work dirs, or folders of them')
    p.add_argument('--out', metavar='PREFIX', help='write PREFIX.md, PREFIX.csv and PREFIX.png')
    p.add_argument(
        '--no-flops',
        action='store_true',
        help='skip the FLOPs measurement (params are still counted)')
    p.add_argument(
        '--flops-cache',
        metavar='FILE',
        help='JSON file remembering measured backbones between calls')
    p.add_argument('--threads', type=int, default=None, help='torch CPU threads')
    args = p.parse_args(argv)
    try:  # before any measurement: a run must not find at its end that it cannot write
        check_outputs(args.out, args.flops_cache)
    except OutputPathError as error:
        p.error(str(error))
    return args


def main(argv=None):
    """Print (and with ``--out`` write) the table; returns its rows."""
    args = parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    return make_gain_table(
        args.work_dirs, out=args.out, flops=not args.no_flops, flops_cache=args.flops_cache)


if __name__ == '__main__':
    main()
