#!/usr/bin/env python
"""Check the datasets of a config before training.

    python tools/misc/check_dataset.py CONFIG [--cfg-options k=v ...] [--splits train val]
                                       [--seg-sample N | --all-seg-maps] [--deep]

Reports per dataset, with counts and the first few file names or ids: images missing on
disk, images without annotations, empty or degenerate segmentations and boxes, classes never
seen, and the problems that would stop mmdet / mmseg or make them mislabel silently (as
ERROR: e.g. image or annotation ids used twice, boxes that are not four numbers, category ids
missing from the file's categories, a training set with no annotation mmdet trains on).
--deep also opens the header of every image and segmentation map: zero-byte, unreadable
and cut-short files, image sizes that differ from the annotation file, maps of another size
than their image. Exit status 1 when there is an error. tools/train.py runs the same check
before training (--skip-dataset-check turns it off; config key deep_dataset_check=True for
--deep). See polaformer_mm/engine/dataset_check.py for what is
read and what it costs.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import polaformer_mm  # noqa: E402,F401  (registers the models)
from polaformer_mm.engine import entry  # noqa: E402
from polaformer_mm.engine.dataset_check import check_datasets, format_reports  # noqa: E402


def parse_args(argv=None):
    p = entry.tool_parser('Check the datasets of a polaformer_mm config')
    entry.add_cfg_options(p, 'override config keys, e.g. train_dataloader.dataset.data_root=...')
    p.add_argument(
        '--splits',
        nargs='+',
        default=['train', 'val', 'test'],
        choices=['train', 'val', 'test'],
        help='which dataloaders (default: all)')
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        '--seg-sample',
        type=int,
        default=64,
        metavar='N',
        help='segmentation maps decoded per dataset (default 64)')
    group.add_argument('--all-seg-maps', action='store_true', help='decode every segmentation map')
    p.add_argument(
        '--deep',
        action='store_true',
        help='also open the header of every image and segmentation map: empty, unreadable '
        'and cut-short files, sizes that differ from the annotation file or from the image '
        '(tools/train.py: config key deep_dataset_check=True)')
    args = p.parse_args(argv)
    if args.seg_sample < 1:
        p.error('--seg-sample must be >= 1')
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = entry.load_config(args.config, args.cfg_options)
    reports = check_datasets(
        cfg,
        seg_sample=None if args.all_seg_maps else args.seg_sample,
        splits=args.splits,
        deep=args.deep)
    print(format_reports(reports, title=args.config))
    return 1 if any(r.errors for r in reports) else 0


if __name__ == '__main__':
    sys.exit(main())
