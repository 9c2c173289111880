#!/usr/bin/env python
"""Train a detector, segmentor or classifier from any config of this project.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp]
                                 [--auto-scale-lr] [--allow-partial] [--skip-dataset-check]
                                 [--cfg-options k=v ...] [--launcher {none,pytorch,slurm,mpi}]

Before anything is built the config's datasets are checked (tools/misc/check_dataset.py);
problems that would stop training end the run with that report. A work dir belongs to one
live run: a second run on it stops at once, naming the first (docs/notes/reliability.md).

Multi-process: tools/dist_train.sh CONFIG NPROC (torchrun; works on CPUs with gloo).
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import polaformer_mm  # noqa: E402,F401  (registers the models and the runner)
from polaformer_mm.engine import entry  # noqa: E402
from polaformer_mm.engine.dataset_check import check_before_training  # noqa: E402


def parse_args(argv=None):
    p = entry.tool_parser('Train with a polaformer_mm config')
    p.add_argument(
        '--work-dir', help='where logs and checkpoints go '
        '(default ./work_dirs/<config name>)')
    p.add_argument(
        '--resume',
        nargs='?',
        const='auto',
        default=None,
        metavar='CKPT',
        help='resume from CKPT, or without a value from the latest '
        'checkpoint in the work dir')
    p.add_argument('--amp', action='store_true', help='mixed precision (CUDA)')
    p.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale the lr by the real batch size (auto_scale_lr in the config)')
    p.add_argument(
        '--skip-dataset-check',
        action='store_true',
        help='do not check the datasets before training '
        '(config key: skip_dataset_check)')
    entry.add_cfg_options(p, 'override config keys, e.g. train_cfg.max_epochs=1')
    entry.add_run_arguments(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = entry.tool_config(args)
    entry.prepare_train_config(
        cfg,
        args.config,
        work_dir=args.work_dir,
        resume=args.resume,
        amp=args.amp,
        auto_scale_lr=args.auto_scale_lr,
        launcher=args.launcher,
        allow_partial=args.allow_partial)
    if not (args.skip_dataset_check or cfg.get('skip_dataset_check', False)):
        check_before_training(cfg)
    entry.run(cfg, lambda runner: runner.train())


if __name__ == '__main__':
    entry.run_tool(main, 'train.py')
