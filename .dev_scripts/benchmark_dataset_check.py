#!/usr/bin/env python
"""Time the dataset check on a COCO-train2017-sized annotation file.

    python .dev_scripts/benchmark_dataset_check.py [--images 118287] [--annotations 860001]
                                                   [--repeat 3] [--dir DIR]

Writes (once, into DIR, default a temporary folder) a COCO instances file with the given
numbers of images and polygon annotations (8-40 points each, like COCO's; about 470 MB at
the default size) and one empty file per image, then runs, per repeat, the check of
``tools/train.py`` (``check_datasets``) and, beside it in the same process, the standard
library's ``json.load`` of the same file, and prints wall and CPU seconds and the ratio
(medians and minima over the repeats; on a busy machine the minimum is the better guide).
"""
import argparse
import json
import os
import os.path as osp
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.config import Config  # noqa: E402

from polaformer_mm.engine.dataset_check import check_datasets, format_reports  # noqa: E402


def write_coco(root: str, num_images: int, num_anns: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    ann_file = osp.join(root, 'annotations', 'instances_train.json')
    if osp.isfile(ann_file):
        return ann_file
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    os.makedirs(osp.join(root, 'train'), exist_ok=True)
    with open(ann_file + '.tmp', 'w') as f:
        f.write('{"info": {}, "licenses": [], "images": [')
        f.write(','.join(
            json.dumps(
                dict(
                    license=1,
                    file_name=f'{i:012d}.jpg',
                    height=480,
                    width=640,
                    coco_url=f'http://images.cocodataset.org/train2017/{i:012d}.jpg',
                    date_captured='2013-11-14 11:18:45',
                    id=i)) for i in range(num_images)))
        f.write('], "annotations": [')
        for a in range(num_anns):
            points = rng.randint(8, 40)
            polygon = [round(rng.uniform(0, 600), 2) for _ in range(2 * points)]
            x, y = rng.uniform(0, 500), rng.uniform(0, 400)
            f.write(('' if a == 0 else ',') + json.dumps(
                dict(
                    segmentation=[polygon],
                    area=1234.5,
                    iscrowd=0,
                    image_id=rng.randrange(num_images),
                    bbox=[round(x, 2), round(y, 2), 50.5, 40.2],
                    category_id=rng.randint(1, 80),
                    id=a)))
        f.write('], "categories": [' + ','.join(
            json.dumps(dict(supercategory='thing', id=i, name=f'class{i}'))
            for i in range(1, 81)) + ']}')
    for i in range(num_images):
        open(osp.join(root, 'train', f'{i:012d}.jpg'), 'w').close()
    os.replace(ann_file + '.tmp', ann_file)
    return ann_file


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--images', type=int, default=118287)
    p.add_argument('--annotations', type=int, default=860001)
    p.add_argument('--repeat', type=int, default=3)
    p.add_argument('--dir', help='where the files go (kept; reused when present)')
    args = p.parse_args(argv)
    if min(args.images, args.annotations, args.repeat) < 1:
        p.error('--images, --annotations and --repeat must be >= 1')
    root = args.dir or tempfile.mkdtemp(prefix='pola_dataset_check_')
    ann_file = write_coco(root, args.images, args.annotations)
    cfg = Config(
        dict(
            default_scope='mmdet',
            train_dataloader=dict(
                dataset=dict(
                    type='CocoDataset',
                    data_root=root,
                    ann_file='annotations/instances_train.json',
                    data_prefix=dict(img='train/'),
                    filter_cfg=dict(filter_empty_gt=True, min_size=32),
                    metainfo=dict(classes=[f'class{i}' for i in range(1, 81)]),
                    pipeline=[
                        dict(type='LoadImageFromFile'),
                        dict(type='LoadAnnotations', with_bbox=True, with_mask=True)
                    ]))))
    import mmdet.datasets  # noqa: F401  (the registry import is not timed)
    rows = []
    for _ in range(args.repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        reports = check_datasets(cfg, splits=('train', ))
        check = (time.perf_counter() - wall, time.process_time() - cpu)
        wall, cpu = time.perf_counter(), time.process_time()
        with open(ann_file, 'rb') as f:
            json.load(f)
        plain = (time.perf_counter() - wall, time.process_time() - cpu)
        rows.append(check + plain)
    print(f'{ann_file}: {osp.getsize(ann_file) / 1e6:.0f} MB, {args.images} images, '
          f'{args.annotations} annotations')
    print('| run | check wall s | check CPU s | json.load wall s | json.load CPU s | '
          'CPU ratio |')
    print('|---|---|---|---|---|---|')
    for i, (cw, cc, jw, jc) in enumerate(rows):
        print(f'| {i + 1} | {cw:.1f} | {cc:.1f} | {jw:.1f} | {jc:.1f} | {jc / cc:.1f}x |')
    for name, stat in (('median', statistics.median), ('min', min)):
        v = [stat(r[k] for r in rows) for k in range(4)]
        print(f'| {name} | {v[0]:.1f} | {v[1]:.1f} | {v[2]:.1f} | {v[3]:.1f} | '
              f'{v[3] / v[1]:.1f}x |')
    print(format_reports(reports))


if __name__ == '__main__':
    main()
