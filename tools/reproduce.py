#!/usr/bin/env python
"""Reproduce a Pola vs softmax comparison: train both configs, evaluate, tabulate.

    python tools/reproduce.py TASK --arch ARCH [--gpus N] [--work-root DIR] [--dry-run]
                              [--cfg-options k=v ...]
    python tools/reproduce.py --all [--dry-run] [...]      # every task and arch
    python tools/reproduce.py --list                       # tasks, archs, configs, cost

For the Pola config of TASK / ARCH and its softmax baseline (the config of the same name
without ``pola-``), one after the other:

1. train: ``tools/train.py`` (``--gpus 1``) or ``tools/dist_train.sh CONFIG N``, work dir
   ``WORK_ROOT/<config name>`` (``tools/train.py``'s default with the default work root
   ``work_dirs``). Skipped when the final checkpoint (``epoch_<max>.pth`` /
   ``iter_<max>.pth``) is there; with ``--resume`` when the run has any checkpoint, so an
   interrupted run continues where it stopped.
2. test the final checkpoint at single scale: ``tools/test.py`` / ``tools/dist_test.sh``
   into ``WORK_ROOT/<config name>/test``; for segmentation also with ``--tta`` (multi-scale
   + flip) into ``.../test_tta``. Skipped when that folder's ``test_metrics.json`` already
   records the final checkpoint with the same ``--cfg-options``.

Then ``tools/analysis_tools/gain_table.py`` (run inside this process) tabulates every run
of the task found under the work root into ``WORK_ROOT/gain_table_<task>.{md,csv,png}``.

Each step is printed (a shell line; comments start with ``#``) before it runs, and
``--dry-run`` prints them without running anything. A failed step stops the script; the
same command again resumes. ``--gpus`` defaults to each config's protocol (``8xb2`` = 8
GPUs x 2 images); with another count the protocol's total batch is kept by setting
``train_dataloader.batch_size`` (total / N) on the command line; a count that does not
divide the total batch stops the script before anything runs, naming the counts that
do. ``--cfg-options`` go to every train and test call, after the script's own (data
paths, smaller test runs, ...).

The plan and the runs are ``polaformer_mm.workflows.reproduce``'s; this script reads the
command line.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from polaformer_mm.workflows import reproduce  # noqa: E402


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        description='Train a Pola config and its softmax baseline, evaluate both and '
        'write the gain table',
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='tasks: ' + ', '.join(f'{t} ({", ".join(d["configs"])})'
                                     for t, d in reproduce.TASKS.items()))
    p.add_argument('task', nargs='?', choices=list(reproduce.TASKS), help='config family')
    p.add_argument(
        '--arch',
        help='backbone, e.g. pvt-t or swin-s (see --list); "all" for '
        'every arch of the task')
    p.add_argument('--all', action='store_true', help='every task and arch')
    p.add_argument('--list', action='store_true', help='print the tasks and exit')
    p.add_argument(
        '--gpus',
        type=int,
        default=None,
        help="GPUs per run (default: the config's protocol); 1 runs "
        'tools/train.py / tools/test.py directly')
    p.add_argument(
        '--work-root',
        default='work_dirs',
        help='runs go to WORK_ROOT/<config name> (default: work_dirs)')
    p.add_argument('--dry-run', action='store_true', help='print the commands only')
    p.add_argument(
        '--cfg-options',
        nargs='+',
        default=[],
        metavar='KEY=VALUE',
        help='passed to every tools/train.py and tools/test.py call')
    args = p.parse_args(argv)
    if args.list:
        return args
    if args.all:
        if args.task or args.arch:
            p.error('--all takes no TASK / --arch')
    elif not args.task or not args.arch:
        p.error('give TASK and --arch (or --all, or --list)')
    elif args.arch != 'all' and args.arch not in reproduce.TASKS[args.task]['configs']:
        p.error(f'--arch {args.arch}: {args.task} has '
                f'{", ".join(reproduce.TASKS[args.task]["configs"])}')
    if args.gpus is not None and args.gpus < 1:
        p.error('--gpus must be >= 1')
    for s in args.cfg_options:
        if '=' not in s:
            p.error(f'--cfg-options {s!r}: expected KEY=VALUE')
    return args


def main(argv=None) -> int:
    """Run the command line; returns the exit status."""
    args = parse_args(argv)
    if args.list:
        reproduce.list_tasks()
        return 0
    planner = reproduce.Planner(args.work_root, args.gpus, args.cfg_options)
    jobs = reproduce.select_jobs(args.task, args.arch, args.all)
    try:  # every config first: a run must not stop at the second config for this
        planner.check_jobs(jobs)
    except reproduce.GpuCountError as err:
        sys.exit(f'reproduce.py: error: {err}')
    return reproduce.run_jobs(planner, jobs, args.dry_run)


if __name__ == '__main__':
    sys.exit(main())
