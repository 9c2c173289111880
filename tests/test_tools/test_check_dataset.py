"""tools/misc/check_dataset.py and the check tools/train.py runs before training."""
import json
import os
import os.path as osp
import shutil
import sys

import cv2
import numpy as np
import pytest

from polaformer_mm.engine import entry
from polaformer_mm.engine.dataset_check import (DatasetCheckError, check_before_training,
                                                check_datasets, format_reports)
from tests import REPO
from .._tools import load_tool

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
SEG = osp.join(REPO, 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py')
CLS = osp.join(REPO, 'configs/imagenet/pola-pvt-tiny_8xb128_in1k.py')


@pytest.fixture
def root(synthetic_data_root, tmp_path):
    """A copy of the synthetic data that a test may break."""
    copy = str(tmp_path / 'synthetic') + '/'
    shutil.copytree(synthetic_data_root, copy)
    return copy


def _cfg(path, root):
    cfg = entry.load_config(path)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = root
    if cfg.default_scope == 'mmdet':
        for key in ('val_evaluator', 'test_evaluator'):
            cfg[key].ann_file = root + 'annotations/instances_val.json'
    return cfg


def _edit_coco(root, split, edit):
    path = osp.join(root, f'annotations/instances_{split}.json')
    with open(path) as f:
        coco = json.load(f)
    edit(coco)
    with open(path, 'w') as f:
        json.dump(coco, f)
    return coco


def _findings(reports, name):
    report = next(r for r in reports if r.name == name)
    return report, '\n'.join(f'{level}: {text}' for level, text in report.findings)


def test_clean_synthetic_data_has_no_errors(synthetic_data_root):
    for path in (DET, SEG):
        reports = check_datasets(_cfg(path, synthetic_data_root))
        assert len(reports) == 2  # train, val (= test)
        assert not any(r.errors for r in reports), format_reports(reports)


def test_empty_segmentation_stops_training_with_the_report(root):
    """mmdet's LoadAnnotations(with_mask=True) would fail with KeyError: 'mask'."""
    coco = _edit_coco(root, 'train', lambda c: c['annotations'][2].update(segmentation=[]))
    ann = coco['annotations'][2]
    name = next(im['file_name'] for im in coco['images'] if im['id'] == ann['image_id'])
    reports = check_datasets(_cfg(DET, root))
    report, text = _findings(reports, 'train_dataloader.dataset')
    assert len(report.errors) == 1, text
    assert 'empty or missing segmentation' in text and "KeyError: 'mask'" in text
    assert f"{name} (annotation {ann['id']})" in text
    with pytest.raises(DatasetCheckError, match='would stop training') as info:
        check_before_training(_cfg(DET, root), verbose=False)
    assert name in str(info.value)


@pytest.mark.slow
def test_the_crash_it_prevents_and_the_opt_out(root, tmp_path):
    """With the check skipped (flag), mmdet itself fails on the same data."""
    _edit_coco(root, 'train', lambda c: [a.update(segmentation=[]) for a in c['annotations']])
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(f"_base_ = [{DET!r}]\ndata_root = {root!r}\n"
                   "train_dataloader = dict(batch_size=2, dataset=dict(data_root=data_root))\n"
                   "val_dataloader = dict(dataset=dict(data_root=data_root))\n"
                   "test_dataloader = val_dataloader\n"
                   "val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')\n"
                   "test_evaluator = val_evaluator\n"
                   "train_cfg = dict(max_epochs=1)\n")
    train = _tool('train')
    with pytest.raises(DatasetCheckError, match="KeyError: 'mask'"):
        train.main([str(cfg), '--work-dir', str(tmp_path / 'wd')])
    with pytest.raises(KeyError, match='mask'):
        train.main([str(cfg), '--work-dir', str(tmp_path / 'wd'), '--skip-dataset-check'])


def test_no_annotated_training_image_is_an_error(root):
    _edit_coco(root, 'train', lambda c: c.update(annotations=[]))
    report, text = _findings(check_datasets(_cfg(DET, root)), 'train_dataloader.dataset')
    assert 'no training image is left after filter_cfg' in text
    assert 'need at least one array to concatenate' in text
    assert 'images without annotations (left out of training by filter_empty_gt): 4' in text


def test_missing_images_degenerate_boxes_unseen_classes(root):
    coco = _edit_coco(root, 'train', lambda c: None)
    gone = coco['images'][1]['file_name']
    os.remove(osp.join(root, 'images/train', gone))

    def edit(c):
        c['annotations'][0]['bbox'][2] = 0.5  # w < 1
        triangle = next(cat['id'] for cat in c['categories'] if cat['name'] == 'triangle')
        c['annotations'] = [a for a in c['annotations'] if a['category_id'] != triangle]
        c['annotations'][-1]['segmentation'] = [[1, 2, 3, 4]]  # 2 points: no polygon

    _edit_coco(root, 'train', edit)
    report, text = _findings(check_datasets(_cfg(DET, root)), 'train_dataloader.dataset')
    assert f'images missing on disk (under {root}images/train/): 1 ({gone})' in text
    assert 'degenerate boxes' in text
    assert 'classes never seen (no usable annotation): 1 (triangle)' in text
    assert 'segmentations without a valid polygon' in text
    assert len(report.errors) == 1, text  # only the missing image stops training


def test_without_msgspec_the_findings_are_the_same(root, monkeypatch):

    def edit(c):
        c['annotations'][0]['segmentation'] = []
        c['annotations'][1]['segmentation'] = [[1, 2, 3, 4]]
        c['annotations'][2]['bbox'][3] = 0
        del c['annotations'][3]['area']

    _edit_coco(root, 'train', edit)
    fast = check_datasets(_cfg(DET, root), splits=('train', ))[0].findings
    monkeypatch.setitem(sys.modules, 'msgspec', None)  # import msgspec fails
    slow = check_datasets(_cfg(DET, root), splits=('train', ))[0].findings
    assert fast == slow
    assert [level for level, _ in fast].count('error') == 2, fast


def test_segmentation_maps(root):
    seg_dir = osp.join(root, 'seg_maps/train')
    names = sorted(os.listdir(seg_dir))
    os.remove(osp.join(seg_dir, names[0]))
    cv2.imwrite(osp.join(seg_dir, names[1]), np.full((112, 144), 9, np.uint8))  # 4 classes
    cv2.imwrite(osp.join(seg_dir, names[2]), np.full((112, 144), 255, np.uint8))
    report, text = _findings(check_datasets(_cfg(SEG, root)), 'train_dataloader.dataset')
    assert 'images without a segmentation map' in text and names[0] in text
    assert 'labels outside 0..3 (and ignore 255)' in text and names[1] in text
    assert 'maps with only ignored pixels: 1' in text and names[2] in text
    assert len(report.errors) == 2, text


def test_classification_paths(tmp_path):
    cfg = entry.load_config(CLS)
    cfg.train_dataloader.dataset.data_root = str(tmp_path / 'nowhere')
    report, text = _findings(check_datasets(cfg, splits=('train', )), 'train_dataloader.dataset')
    assert 'data_root not found' in text and report.errors


def test_command_line(root, capsys):
    _edit_coco(root, 'val', lambda c: c['annotations'][0].pop('area'))
    status = _tool('misc/check_dataset').main([
        DET, '--cfg-options', f'train_dataloader.dataset.data_root={root}',
        f'val_dataloader.dataset.data_root={root}', f'test_dataloader.dataset.data_root={root}'
    ])
    out = capsys.readouterr().out
    assert status == 1, out
    assert 'val_dataloader.dataset: CocoDataset' in out
    assert "ERROR: annotations without 'area' (mmdet stops with KeyError: 'area'): 1" in out


def _tool(name):
    return load_tool(f'{name}.py', f'tool_{osp.basename(name)}')


def _mmdet_dataset(cfg):
    """The training set as mmdet builds it (its annotation file read by pycocotools)."""
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    return DATASETS.build(cfg.train_dataloader.dataset)


def _instances(dataset):
    return {
        osp.basename(dataset.get_data_info(i)['img_path']): dataset.get_data_info(i)['instances']
        for i in range(len(dataset))
    }


def _make_one_id_twice(c):
    c['images'][1]['id'] = c['images'][0]['id']


def test_an_image_id_listed_twice_stops_training(root):
    """pycocotools keeps the last entry of an id: mmdet trains 000001.jpg with the boxes
    of both entries and never sees 000000.jpg."""
    coco = _edit_coco(root, 'train', _make_one_id_twice)
    first, second = coco['images'][0], coco['images'][1]
    per_id = sum(a['image_id'] == first['id'] for a in coco['annotations'])
    instances = _instances(_mmdet_dataset(_cfg(DET, root)))
    assert first['file_name'] not in instances
    assert len(instances[second['file_name']]) == per_id

    report, text = _findings(check_datasets(_cfg(DET, root)), 'train_dataloader.dataset')
    assert ('image ids listed more than once (pycocotools keeps the last entry of an id: '
            'mmdet trains that file with the boxes of all its entries and never sees the '
            f"other files), ids: 1 ({first['id']} ({first['file_name']}, "
            f"{second['file_name']}))") in text
    assert len(report.errors) == 1, text
    with pytest.raises(DatasetCheckError, match='image ids listed more than once'):
        check_before_training(_cfg(DET, root), verbose=False)


def test_an_annotation_id_used_twice_stops_training(root):
    coco = _edit_coco(root, 'train',
                      lambda c: c['annotations'][3].update(id=c['annotations'][0]['id']))
    with pytest.raises(AssertionError, match='not unique'):
        _mmdet_dataset(_cfg(DET, root))
    report, text = _findings(check_datasets(_cfg(DET, root)), 'train_dataloader.dataset')
    assert ('annotation ids used more than once (mmdet stops with "AssertionError: Annotation '
            f'ids ... are not unique"), ids: 1 ({coco["annotations"][0]["id"]})') in text
    assert len(report.errors) == 1, text


@pytest.mark.parametrize('bbox', [[10, 10, '12', 20], [10, 10, 20], None, [10, True, 20, 20]])
def test_a_box_that_is_not_four_numbers_stops_training(root, bbox):
    coco = _edit_coco(root, 'train', lambda c: c['annotations'][2].update(bbox=bbox))
    if bbox is None or isinstance(bbox[2], str) or len(bbox) != 4:
        with pytest.raises((TypeError, ValueError)):
            _mmdet_dataset(_cfg(DET, root))
    ann = coco['annotations'][2]
    name = next(im['file_name'] for im in coco['images'] if im['id'] == ann['image_id'])
    report, text = _findings(check_datasets(_cfg(DET, root)), 'train_dataloader.dataset')
    assert ('bboxes that are not 4 numbers [x, y, w, h] (mmdet stops with a TypeError or '
            f"ValueError): 1 ({name} (annotation {ann['id']}) {bbox!r})") in text
    assert len(report.errors) == 1, text


@pytest.mark.parametrize('value', [float('nan'), float('inf')])
def test_a_box_with_nan_or_infinity_stops_training(root, value):
    """Python's json (pycocotools) reads NaN and Infinity; mmdet drops a NaN box
    silently and keeps an infinite one."""

    def edit(c):
        c['annotations'][1]['bbox'][3] = value  # h

    coco = _edit_coco(root, 'train', edit)
    ann = coco['annotations'][1]
    instances = [i for v in _instances(_mmdet_dataset(_cfg(DET, root))).values() for i in v]
    assert any(not np.isfinite(i['bbox']).all() for i in instances) == (value == float('inf'))
    report, text = _findings(check_datasets(_cfg(DET, root)), 'train_dataloader.dataset')
    assert 'bboxes with NaN or infinite values (mmdet drops NaN boxes silently and trains ' \
        "on infinite ones): 1 (" in text and f"(annotation {ann['id']})" in text
    assert len(report.errors) == 1, text


def test_a_category_id_missing_from_categories_stops_training(root):
    """mmdet drops the annotation silently (the object would train as background)."""
    coco = _edit_coco(root, 'train', lambda c: c['annotations'][4].update(category_id=99))
    total = sum(len(v) for v in _instances(_mmdet_dataset(_cfg(DET, root))).values())
    assert total == len(coco['annotations']) - 1
    report, text = _findings(check_datasets(_cfg(DET, root)), 'train_dataloader.dataset')
    assert ("annotations whose category_id is not among the file's categories (mmdet drops "
            'them silently: those objects would train as background), annotation ids: 1 '
            f"({coco['annotations'][4]['id']} (category_id 99))") in text
    assert len(report.errors) == 1, text


def test_categories_the_config_leaves_out_are_a_note(root, tmp_path):
    """The config's classes explain why mmdet leaves some annotations out: no error."""
    coco = _edit_coco(root, 'train', lambda c: None)
    cfg = _cfg(DET, root)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.metainfo = dict(classes=('circle', 'square'))
    triangle = next(c['id'] for c in coco['categories'] if c['name'] == 'triangle')
    count = sum(a['category_id'] == triangle for a in coco['annotations'])
    report, text = _findings(check_datasets(cfg), 'train_dataloader.dataset')
    assert not report.errors, text
    assert ("note: annotations of categories outside the config's classes (mmdet leaves them "
            f'out, as the classes say): {count} (triangle ({count}))') in text


def test_crowd_only_annotations_stop_training(root):
    """Every box a crowd region: mmdet keeps the images but ignores every box, so the
    box and mask losses would be exactly 0."""
    coco = _edit_coco(root, 'train', lambda c: [a.update(iscrowd=1) for a in c['annotations']])
    instances = [i for v in _instances(_mmdet_dataset(_cfg(DET, root))).values() for i in v]
    assert instances and all(i['ignore_flag'] == 1 for i in instances)
    report, text = _findings(check_datasets(_cfg(DET, root)), 'train_dataloader.dataset')
    assert ('no training image has an annotation mmdet trains on (every one is a crowd region '
            '(iscrowd), ignored, degenerate or of another class): the box and mask losses '
            'would be 0') in text
    assert (f"note: crowd annotations (iscrowd; mmdet ignores them in training): "
            f"{len(coco['annotations'])}") in text
    assert len(report.errors) == 1, text


def test_some_crowd_annotations_are_only_a_note(root):
    _edit_coco(root, 'train', lambda c: c['annotations'][0].update(iscrowd=1))
    report, text = _findings(check_datasets(_cfg(DET, root)), 'train_dataloader.dataset')
    assert not report.errors, text
    assert 'note: crowd annotations (iscrowd; mmdet ignores them in training): 1' in text


def test_the_command_line_and_train_stop_on_data_mmdet_mislabels(root, tmp_path, capsys):
    """Several problems in one file, as a user runs the tools on it."""

    def edit(c):
        _make_one_id_twice(c)
        c['annotations'][5]['id'] = c['annotations'][6]['id']
        c['annotations'][7]['bbox'][0] = 'x'
        c['annotations'][8]['category_id'] = 42

    _edit_coco(root, 'train', edit)
    args = [
        DET, '--cfg-options', f'train_dataloader.dataset.data_root={root}',
        f'val_dataloader.dataset.data_root={root}', f'test_dataloader.dataset.data_root={root}'
    ]
    status = _tool('misc/check_dataset').main(args)
    out = capsys.readouterr().out
    assert status == 1, out
    assert 'dataset check: 2 datasets, 4 problems that would stop training' in out
    for line in ('ERROR: image ids listed more than once', 'ERROR: annotation ids used more than',
                 'ERROR: bboxes that are not 4 numbers', 'ERROR: annotations whose category_id'):
        assert line in out, out
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(f"_base_ = [{DET!r}]\ndata_root = {root!r}\n"
                   "train_dataloader = dict(dataset=dict(data_root=data_root))\n"
                   "val_dataloader = dict(dataset=dict(data_root=data_root))\n"
                   "test_dataloader = val_dataloader\n"
                   "val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')\n"
                   "test_evaluator = val_evaluator\n")
    with pytest.raises(DatasetCheckError, match='4 problems that would stop training'):
        _tool('train').main([str(cfg), '--work-dir', str(tmp_path / 'wd')])


def test_broken_values_do_not_break_the_check(root):
    """Ids that no dict can hold, sizes and areas that are not numbers: errors, no
    traceback from the check itself."""

    def edit(c):
        c['images'][0]['width'] = '144'
        others = [a for a in c['annotations'] if a['image_id'] != c['images'][0]['id']]
        others[0]['image_id'] = [1]
        others[1]['area'] = 'big'
        c['categories'].append({'id': [7], 'name': 'odd'})

    _edit_coco(root, 'train', edit)
    report, text = _findings(check_datasets(_cfg(DET, root)), 'train_dataloader.dataset')
    assert 'images whose width or height is not a number' in text
    assert 'annotations whose id, image_id or category_id is not a number or string' in text
    assert "annotations whose 'area' is not a number" in text
    assert 'category ids that are not numbers or strings' in text
    assert len(report.errors) == 4, text


def test_a_training_set_of_only_ignored_pixels_stops_training(root):
    seg_dir = osp.join(root, 'seg_maps/train')
    for name in os.listdir(seg_dir):
        cv2.imwrite(osp.join(seg_dir, name), np.full((112, 144), 255, np.uint8))
    report, text = _findings(check_datasets(_cfg(SEG, root)), 'train_dataloader.dataset')
    assert 'every decoded map holds only ignored pixels (ignore_index 255)' in text
    assert 'decode loss would be 0' in text
    assert len(report.errors) == 1, text
