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
from .._smoke import synthetic_root

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
SEG = osp.join(REPO, 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py')
CLS = osp.join(REPO, 'configs/imagenet/pola-pvt-tiny_8xb128_in1k.py')


@pytest.fixture(scope='module')
def clean_root(tmp_path_factory):
    return synthetic_root(tmp_path_factory.mktemp('data'))


@pytest.fixture
def root(clean_root, tmp_path):
    """A copy of the synthetic data that a test may break."""
    copy = str(tmp_path / 'synthetic') + '/'
    shutil.copytree(clean_root, copy)
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


def test_clean_synthetic_data_has_no_errors(clean_root):
    for path in (DET, SEG):
        reports = check_datasets(_cfg(path, clean_root))
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
    import importlib.util
    spec = importlib.util.spec_from_file_location(f'tool_{osp.basename(name)}',
                                                  osp.join(REPO, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
