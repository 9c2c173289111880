#!/usr/bin/env python
"""Generate the synthetic shapes dataset (COCO instances + semantic label maps).

    python tools/dataset_converters/generate_synthetic_data.py [--out data/synthetic]
        [--num-train N] [--num-val N] [--size H [W]] [--seed S] [--max-shapes M]
        [--overwrite] [--workers N] [--cityscapes] [--panoptic]

Writes ``images/{train,val}/*.jpg``, ``annotations/instances_{train,val}.json``,
``seg_maps/{train,val}/*.png`` and ``meta.json`` under ``--out``; with ``--cityscapes`` also
a copy in Cityscapes' layout under ``--out``/cityscapes (19 classes; mmseg's
``CityscapesDataset`` with ``data_root`` there); with ``--panoptic`` also COCO-panoptic
annotations of the same images, ``annotations/panoptic_{train,val}.json`` and the PNG
segment maps ``annotations/panoptic_{train,val}/*.png`` (things: the three shapes, one
segment per instance; stuff: ``background``; mmdet's ``CocoPanopticDataset`` with
``data_prefix=dict(img='images/train/', seg='annotations/panoptic_train/')``). A second
call with the same arguments finds the dataset complete and writes nothing; a call with
other arguments stops with an error unless ``--overwrite`` is given.
"""
import argparse
import json
import os
import os.path as osp
import sys

import cv2
import numpy as np

from polaformer_mm.datasets.synthetic import (SYNTHETIC_CLASSES, SYNTHETIC_DEFAULTS,
                                              generate_synthetic_dataset, write_cityscapes_layout)

#: the panoptic categories: the synthetic shapes (things) and the background (stuff)
PANOPTIC_THING_CLASSES = tuple(SYNTHETIC_CLASSES)
PANOPTIC_STUFF_CLASSES = ('background', )
_BACKGROUND_SEGMENT_ID = 1000  # (232, 3, 0) in RGB: the green byte is used too


def _id2rgb(ids):
    return np.stack([ids % 256, ids // 256 % 256, ids // 65536 % 256], axis=-1).astype(np.uint8)


def _panoptic_image(img, anns, height, width, background_cat):
    """(PNG segment map as RGB, segments_info) of one image: each instance a segment
    (drawn in annotation order, as the images are), the rest one background segment."""
    from pycocotools import mask as mask_utils
    ids = np.full((height, width), _BACKGROUND_SEGMENT_ID, dtype=np.int64)
    cats = {}
    for k, ann in enumerate(anns, start=1):
        rles = mask_utils.frPyObjects(ann['segmentation'], height, width)
        ids[mask_utils.decode(mask_utils.merge(rles)).astype(bool)] = k
        cats[k] = ann['category_id']
    cats[_BACKGROUND_SEGMENT_ID] = background_cat
    segments = []
    for seg_id, cat in cats.items():
        ys, xs = np.nonzero(ids == seg_id)
        if not len(xs):  # painted over entirely
            continue
        x1, y1 = int(xs.min()), int(ys.min())
        segments.append(
            dict(
                id=int(seg_id),
                category_id=int(cat),
                area=int(len(xs)),
                bbox=[x1, y1, int(xs.max()) - x1 + 1,
                      int(ys.max()) - y1 + 1],
                iscrowd=0))
    return _id2rgb(ids), segments


def write_panoptic_layout(root):
    """Write COCO-panoptic annotations of the synthetic images under ``root`` (see the
    module notes); returns the annotation files written."""
    written = []
    for split in ('train', 'val'):
        with open(osp.join(root, 'annotations', f'instances_{split}.json')) as f:
            coco = json.load(f)
        cats = [dict(c, isthing=1) for c in coco['categories']]
        background = max(c['id'] for c in cats) + 1
        cats.append(dict(id=background, name=PANOPTIC_STUFF_CLASSES[0], isthing=0))
        seg_dir = osp.join(root, 'annotations', f'panoptic_{split}')
        os.makedirs(seg_dir, exist_ok=True)
        by_image = {}
        for ann in coco['annotations']:
            by_image.setdefault(ann['image_id'], []).append(ann)
        annotations = []
        for img in coco['images']:
            png_name = osp.splitext(img['file_name'])[0] + '.png'
            rgb, segments = _panoptic_image(img, by_image.get(img['id'], []), img['height'],
                                            img['width'], background)
            cv2.imwrite(osp.join(seg_dir, png_name), rgb[..., ::-1])
            annotations.append(dict(image_id=img['id'], file_name=png_name, segments_info=segments))
        out = osp.join(root, 'annotations', f'panoptic_{split}.json')
        with open(out, 'w') as f:
            json.dump(dict(images=coco['images'], annotations=annotations, categories=cats), f)
        written.append(out)
    return written


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
    parser.add_argument(
        '--panoptic',
        action='store_true',
        help='also write COCO-panoptic annotations (OUT/annotations/panoptic_{train,val}.json '
        'and the PNG maps beside them)')
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
    if args.panoptic:
        print(f"COCO panoptic: {', '.join(write_panoptic_layout(args.out))}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
