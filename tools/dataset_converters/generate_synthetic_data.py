#!/usr/bin/env python
"""Generate the synthetic shapes dataset (COCO instances + semantic label maps).

    python tools/dataset_converters/generate_synthetic_data.py [--out data/synthetic]
        [--num-train N] [--num-val N] [--size H [W]] [--seed S] [--max-shapes M]
        [--overwrite] [--workers N] [--cityscapes]

Writes ``images/{train,val}/*.jpg``, ``annotations/instances_{train,val}.json``,
``seg_maps/{train,val}/*.png`` and ``meta.json`` under ``--out``; with ``--cityscapes`` also
a copy in Cityscapes' layout under ``--out``/cityscapes (19 classes; mmseg's
``CityscapesDataset`` with ``data_root`` there). A second call with the same
arguments finds the dataset complete and writes nothing; a call with other arguments stops
with an error unless ``--overwrite`` is given.
"""
import argparse
import os
import sys

from polaformer_mm.datasets.synthetic import (SYNTHETIC_DEFAULTS, generate_synthetic_dataset,
                                              write_cityscapes_layout)


def format_summary(summary):
    args = summary['args']
    height, width = args['img_size']
    verb = 'generated' if summary['generated'] else 'already complete, nothing written:'
    lines = [
        f"{verb} {summary['root']} in {summary['seconds']:.2f} s "
        f"({height}x{width}, seed {args['seed']}, max_shapes {args['max_shapes']})",
        f"classes: {', '.join(summary['classes'])} (seg maps: 0 = background, "
        f"1..{len(summary['classes'])} = classes)"
    ]
    for split, info in summary['splits'].items():
        per_class = ', '.join(f'{k} {v}' for k, v in info['per_class'].items())
        lines.append(f"{split}: {info['images']} images, {info['instances']} instances "
                     f"({per_class}; {info['occluded']} partly occluded) -> "
                     f"{info['ann_file']}, {info['img_dir']}/, {info['seg_dir']}/")
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='data/synthetic', help='output folder')
    parser.add_argument('--num-train', type=int, default=SYNTHETIC_DEFAULTS['num_train'])
    parser.add_argument('--num-val', type=int, default=SYNTHETIC_DEFAULTS['num_val'])
    parser.add_argument(
        '--size',
        type=int,
        nargs='+',
        metavar='H [W]',
        default=list(SYNTHETIC_DEFAULTS['img_size']),
        help='image height and width (one value: square)')
    parser.add_argument('--seed', type=int, default=SYNTHETIC_DEFAULTS['seed'])
    parser.add_argument('--max-shapes', type=int, default=SYNTHETIC_DEFAULTS['max_shapes'])
    parser.add_argument(
        '--overwrite', action='store_true', help='replace a dataset generated with other arguments')
    parser.add_argument(
        '--workers',
        type=int,
        default=min(4,
                    os.cpu_count() or 1),
        help='processes rendering the images (the same files for any number; default: one '
        'per CPU core, at most 4)')
    parser.add_argument(
        '--cityscapes',
        action='store_true',
        help="also write the Cityscapes-layout copy (OUT/cityscapes: leftImg8bit/, gtFine/)")
    args = parser.parse_args(argv)
    if len(args.size) > 2:
        parser.error('--size takes H or H W')
    size = args.size[0] if len(args.size) == 1 else tuple(args.size)
    try:
        summary = generate_synthetic_dataset(
            args.out,
            num_train=args.num_train,
            num_val=args.num_val,
            img_size=size,
            seed=args.seed,
            max_shapes=args.max_shapes,
            overwrite=args.overwrite,
            workers=args.workers)
    except (FileExistsError, ValueError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    print(format_summary(summary))
    if args.cityscapes:
        print(f'Cityscapes layout: {write_cityscapes_layout(args.out)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
