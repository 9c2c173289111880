#!/usr/bin/env python
"""Quickstart: a detector and a segmenter trained from scratch on built-in synthetic data.

    python tools/quickstart.py [--compare] [--tasks det seg] [--data-root data/synthetic]
                               [--work-dir work_dirs/quickstart] [--num-train N] [--num-val N]
                               [--score-thr 0.5] [--num-draw 8] [--jobs N]
                               [--cfg-options k=v ...]
                               [--det-options k=v ...] [--seg-options k=v ...]

1. generates the synthetic dataset if it is missing (deterministic; the generator's defaults,
   or ``--num-train`` / ``--num-val``);
2. for each task (det: Mask R-CNN, seg: Semantic FPN, both with the small Pola-PVT of
   configs/quickstart/), in a child process of its own (its peak memory, max RSS, is its
   own): trains the model from scratch the way ``tools/train.py`` does
   (polaformer_mm.engine.entry, PolaRunner), evaluates the trained checkpoint on the
   held-out split as ``tools/test.py --out`` does, with the real CocoMetric (bbox + segm) /
   IoUMetric (and each class's IoU), and draws ground truth beside prediction for the first
   ``--num-draw`` validation images into one PNG per model. On a CPU two such processes run
   side by side, one thread each (``--jobs``), which uses two cores better than one process
   with two threads;
3. prints a table, the time of each stage, the metrics against the floors a working
   install reaches (``FLOORS``) and what to expect (``EXPECTED``), and writes everything
   to ``<work-dir>/summary.json``.

The work is done by ``polaformer_mm.workflows.quickstart`` (``FLOORS`` and ``EXPECTED``
are there); this script reads the command line.

``--compare`` trains and evaluates each task a second time with softmax attention in every
stage (``model.backbone.attn_types='SSSS'``: PVT spatial-reduction attention, otherwise the
same backbone, heads, data and schedule) and prints both side by side: metrics, training
time and peak memory.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.config import DictAction  # noqa: E402

from polaformer_mm.datasets import SYNTHETIC_DEFAULTS  # noqa: E402
from polaformer_mm.workflows.quickstart import TASKS, run_quickstart  # noqa: E402


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument(
        '--compare',
        action='store_true',
        help="also train the softmax counterpart (attn_types='SSSS') and print "
        'both side by side')
    p.add_argument('--tasks', nargs='+', choices=sorted(TASKS), default=['det', 'seg'])
    p.add_argument('--data-root', default='data/synthetic')
    p.add_argument('--work-dir', default='work_dirs/quickstart')
    p.add_argument(
        '--num-train',
        type=int,
        default=SYNTHETIC_DEFAULTS['num_train'],
        help='training images to generate')
    p.add_argument(
        '--num-val',
        type=int,
        default=SYNTHETIC_DEFAULTS['num_val'],
        help='held-out images to generate')
    p.add_argument(
        '--score-thr',
        type=float,
        default=0.5,
        help='detections drawn: score at least this (the default run\'s detector scores most of '
        'its correct boxes above 0.5, most of its spurious ones below)')
    p.add_argument('--num-draw', type=int, default=8, help='validation images drawn per model')
    p.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        default={},
        help='overrides applied to every task config')
    p.add_argument(
        '--jobs',
        type=int,
        default=None,
        help='training processes side by side, CPU threads split among them (default: 2 on '
        'a CPU with 2 or more cores, 1 on a GPU)')
    p.add_argument(
        '--det-options',
        nargs='+',
        action=DictAction,
        default={},
        help='overrides of the detection config only')
    p.add_argument(
        '--seg-options',
        nargs='+',
        action=DictAction,
        default={},
        help='overrides of the segmentation config only')
    return p.parse_args(argv)


def main(argv=None):
    """Run the quickstart; returns {(task, variant): summary row}."""
    args = parse_args(argv)
    return run_quickstart(
        tasks=args.tasks,
        compare=args.compare,
        data_root=args.data_root,
        work_dir=args.work_dir,
        num_train=args.num_train,
        num_val=args.num_val,
        score_thr=args.score_thr,
        num_draw=args.num_draw,
        jobs=args.jobs,
        cfg_options=args.cfg_options,
        task_options=dict(det=args.det_options, seg=args.seg_options))


if __name__ == '__main__':
    main()
