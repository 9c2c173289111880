#!/usr/bin/env python
"""Evaluate a checkpoint with any config of this project.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE] [--show]
                         [--show-dir DIR] [--tta] [--allow-partial] [--cfg-options k=v ...]
                         [--launcher ...]

The checkpoint must fit the model (every key, every shape); --allow-partial loads what fits.
The work dir must not be in use by another live run (docs/notes/reliability.md).

--out: detection/classification results as a .pkl; segmentation: a folder of
prediction PNGs. --show-dir: images with predictions drawn. --tta: test-time
augmentation (the config's tta_model / tta_pipeline; segmentation and box detectors).
The metrics are also written to <work dir>/test_metrics.json.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import polaformer_mm  # noqa: E402,F401  (registers the models and the runner)
from polaformer_mm.engine import entry  # noqa: E402


def parse_args(argv=None):
    p = entry.tool_parser('Test a checkpoint with a polaformer_mm config')
    p.add_argument('checkpoint', help='checkpoint file (path or URL)')
    p.add_argument('--work-dir', help='where the evaluation log goes')
    p.add_argument('--out', help='dump predictions (.pkl; a folder for segmentation)')
    p.add_argument('--show', action='store_true', help='show predictions in a window')
    p.add_argument('--show-dir', help='write images with predictions drawn here')
    p.add_argument('--wait-time', type=float, default=2, help='seconds between shown images')
    p.add_argument(
        '--tta',
        action='store_true',
        help="test-time augmentation with the config's tta_model / tta_pipeline "
        '(ADE20K: multi-scale + flip; COCO box detectors: flip)')
    entry.add_cfg_options(p)
    entry.add_run_arguments(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = entry.tool_config(args)
    entry.prepare_test_config(
        cfg,
        args.config,
        args.checkpoint,
        work_dir=args.work_dir,
        out=args.out,
        show=args.show,
        show_dir=args.show_dir,
        wait_time=args.wait_time,
        launcher=args.launcher,
        tta=args.tta,
        allow_partial=args.allow_partial)

    def test(runner):
        metrics = runner.test()
        entry.save_test_metrics(
            cfg, args.config, args.checkpoint, metrics, tta=args.tta, cfg_options=args.cfg_options)
        return metrics

    return entry.run(cfg, test)


if __name__ == '__main__':
    entry.run_tool(main, 'test.py')
