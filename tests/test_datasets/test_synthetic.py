import json
import os
import os.path as osp

import cv2
import numpy as np
import pytest
from mmengine.registry import DefaultScope
from pycocotools.coco import COCO

import polaformer_mm  # noqa: F401  (first: lets torchvision import on CPU-only torch)
from polaformer_mm.datasets import (SYNTHETIC_CITYSCAPES_TRAIN_IDS, SYNTHETIC_CLASSES,
                                    SYNTHETIC_GENERATOR_VERSION, SYNTHETIC_PALETTE,
                                    SYNTHETIC_SEG_CLASSES, SYNTHETIC_SEG_PALETTE,
                                    generate_synthetic_dataset, write_cityscapes_layout)
from .._tools import load_tool

# pycocotools' mask.decode under numpy 2, called by annToMask and mmdet's LoadAnnotations
pytestmark = pytest.mark.filterwarnings('ignore:__array__ implementation:DeprecationWarning')

SMALL = dict(num_train=8, num_val=3, img_size=(64, 80), seed=3, max_shapes=4)


@pytest.fixture(scope='module')
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp('synthetic')
    summary = generate_synthetic_dataset(root, **SMALL)
    return str(root), summary


def _files(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = osp.join(dirpath, name)
            with open(path, 'rb') as f:
                out[osp.relpath(path, root)] = f.read()
    return out


def test_layout_and_summary(dataset):
    root, summary = dataset
    assert summary['generated'] is True and summary['root'] == root
    assert summary['args'] == dict(SMALL, img_size=[64, 80])
    assert summary['classes'] == list(SYNTHETIC_CLASSES)
    assert summary['seg_classes'] == ['background'] + list(SYNTHETIC_CLASSES)
    assert len(SYNTHETIC_PALETTE) == len(SYNTHETIC_CLASSES)
    assert len(SYNTHETIC_SEG_PALETTE) == len(SYNTHETIC_SEG_CLASSES)
    for split, count in (('train', 8), ('val', 3)):
        info = summary['splits'][split]
        assert info['images'] == count
        assert info['instances'] == sum(info['per_class'].values()) > 0
        names = [f'{i:06d}' for i in range(count)]
        assert sorted(os.listdir(osp.join(root, 'images', split))) == \
            [n + '.jpg' for n in names]
        assert sorted(os.listdir(osp.join(root, 'seg_maps', split))) == \
            [n + '.png' for n in names]
        assert osp.isfile(osp.join(root, 'annotations', f'instances_{split}.json'))
    with open(osp.join(root, 'meta.json')) as f:
        meta = json.load(f)
    assert meta == {k: v for k, v in summary.items() if k not in ('root', 'generated', 'seconds')}
    assert not osp.exists(osp.join(root, '.incomplete'))


def test_deterministic(dataset, tmp_path):
    root, _ = dataset
    generate_synthetic_dataset(tmp_path / 'again', **SMALL)
    first, second = _files(root), _files(tmp_path / 'again')
    assert first.keys() == second.keys()
    assert all(first[k] == second[k] for k in first)
    generate_synthetic_dataset(tmp_path / 'other', **dict(SMALL, seed=4))
    other = _files(tmp_path / 'other')
    assert other['images/train/000000.jpg'] != first['images/train/000000.jpg']


@pytest.mark.slow
def test_workers_write_the_same_files(tmp_path):
    # enough images for two forked workers (each takes chunks of 64 images)
    args = dict(SMALL, num_train=200, num_val=2)
    one = generate_synthetic_dataset(tmp_path / 'one', **args)
    two = generate_synthetic_dataset(tmp_path / 'two', workers=2, **args)
    assert one['splits'] == two['splits']
    first, second = _files(tmp_path / 'one'), _files(tmp_path / 'two')
    assert first.keys() == second.keys() and len(first) > 2 * args['num_train']
    assert [k for k in first if first[k] != second[k]] == []
    with pytest.raises(ValueError, match='workers must be an int >= 1, got 0'):
        generate_synthetic_dataset(tmp_path / 'none', workers=0, **args)


def test_idempotent_and_mismatch(tmp_path):
    root = tmp_path / 'data'
    args = dict(SMALL, num_train=2, num_val=1)
    generate_synthetic_dataset(root, **args)
    img = root / 'images' / 'train' / '000000.jpg'
    os.utime(img, (1, 1))
    summary = generate_synthetic_dataset(root, **args)
    assert summary['generated'] is False and img.stat().st_mtime == 1  # nothing rewritten
    with pytest.raises(FileExistsError, match=r'num_train=2 \(requested 3\)'):
        generate_synthetic_dataset(root, **dict(args, num_train=3))
    with pytest.raises(FileExistsError, match=r'img_size=\[64, 80\] \(requested \[64, 64\]\)'):
        generate_synthetic_dataset(root, **dict(args, img_size=64))
    summary = generate_synthetic_dataset(root, **dict(args, num_train=3), overwrite=True)
    assert summary['generated'] is True and summary['splits']['train']['images'] == 3
    # an interrupted generation (marker left, meta.json not yet written) is redone
    os.remove(root / 'meta.json')
    (root / '.incomplete').write_text('')
    (root / 'images' / 'train' / 'stale.jpg').write_bytes(b'')
    summary = generate_synthetic_dataset(root, **dict(args, num_train=3))
    assert summary['generated'] is True
    assert sorted(os.listdir(root / 'images' / 'train')) == \
        ['000000.jpg', '000001.jpg', '000002.jpg']
    # a missing file makes a matching dataset incomplete: regenerated
    os.remove(root / 'seg_maps' / 'val' / '000000.png')
    assert generate_synthetic_dataset(root, **dict(args, num_train=3))['generated'] is True
    # the same arguments from an older version of this generator: written again, with
    # a warning; another generator's meta.json is refused
    meta_path = root / 'meta.json'
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(dict(meta, version=SYNTHETIC_GENERATOR_VERSION - 1)))
    with pytest.warns(UserWarning, match=f'version {SYNTHETIC_GENERATOR_VERSION - 1}; writing'):
        assert generate_synthetic_dataset(root, **dict(args, num_train=3))['generated'] is True
    assert json.loads(meta_path.read_text())['version'] == SYNTHETIC_GENERATOR_VERSION
    meta_path.write_text(json.dumps(dict(meta, generator='elsewhere', version=1)))
    with pytest.raises(FileExistsError, match="generator 'elsewhere'"):
        generate_synthetic_dataset(root, **dict(args, num_train=3))
    # files of something else: refused unless overwrite
    foreign = tmp_path / 'foreign'
    (foreign / 'images').mkdir(parents=True)
    (foreign / 'images' / 'photo.jpg').write_bytes(b'')
    with pytest.raises(FileExistsError, match='no meta.json'):
        generate_synthetic_dataset(foreign, **args)
    assert generate_synthetic_dataset(foreign, **args, overwrite=True)['generated']


@pytest.mark.parametrize('kwargs', [
    dict(img_size=(16, 64)),
    dict(img_size='big'),
    dict(num_train=0),
    dict(seed=-1),
    dict(max_shapes=0),
    dict(num_val=2.5)
])
def test_invalid_arguments(tmp_path, kwargs):
    with pytest.raises(ValueError):
        generate_synthetic_dataset(tmp_path, **dict(SMALL, **kwargs))
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize('split', ['train', 'val'])
def test_annotations_consistent(dataset, split):
    root, summary = dataset
    coco = COCO(osp.join(root, 'annotations', f'instances_{split}.json'))
    assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(SYNTHETIC_CLASSES)
    assert coco.getCatIds() == [1, 2, 3]
    per_class = dict.fromkeys(SYNTHETIC_CLASSES, 0)
    ann_ids = set()
    for img_id in coco.getImgIds():
        assert coco.getAnnIds(imgIds=img_id)  # every image has a shape
        info = coco.loadImgs(img_id)[0]
        h, w = info['height'], info['width']
        assert (h, w) == (64, 80)
        image = cv2.imread(osp.join(root, 'images', split, info['file_name']))
        assert image.shape == (h, w, 3)
        seg = cv2.imread(
            osp.join(root, 'seg_maps', split, info['file_name'].replace('.jpg', '.png')),
            cv2.IMREAD_UNCHANGED)
        assert seg.dtype == np.uint8 and seg.shape == (h, w)
        painted = np.zeros((h, w), np.uint8)
        covered = np.zeros((h, w), bool)
        for ann in coco.loadAnns(sorted(coco.getAnnIds(imgIds=img_id))):
            assert ann['id'] not in ann_ids and ann['id'] >= 1
            ann_ids.add(ann['id'])
            assert ann['category_id'] in (1, 2, 3) and ann['iscrowd'] == 0
            assert ann['segmentation'] and all(
                len(p) >= 6 and len(p) % 2 == 0 for p in ann['segmentation'])
            mask = coco.annToMask(ann).astype(bool)
            assert ann['area'] == mask.sum() > 0
            ys, xs = np.nonzero(mask)
            x0, y0 = xs.min(), ys.min()
            assert ann['bbox'] == [x0, y0, xs.max() - x0 + 1, ys.max() - y0 + 1]
            assert not np.any(covered & mask)  # visible parts do not overlap
            covered |= mask
            painted[mask] = ann['category_id']
            per_class[SYNTHETIC_CLASSES[ann['category_id'] - 1]] += 1
        np.testing.assert_array_equal(seg, painted)
    assert per_class == summary['splits'][split]['per_class']


def test_mmdet_coco_dataset(dataset):
    from mmcv.transforms import LoadImageFromFile
    from mmdet.datasets import CocoDataset
    from mmdet.datasets.transforms import LoadAnnotations
    root, _ = dataset
    with DefaultScope.overwrite_default_scope('mmdet'):
        ds = CocoDataset(
            data_root=root,
            ann_file='annotations/instances_train.json',
            data_prefix=dict(img='images/train/'),
            metainfo=dict(classes=SYNTHETIC_CLASSES, palette=SYNTHETIC_PALETTE),
            pipeline=[],
            lazy_init=False)
    assert len(ds) == 8
    assert ds.metainfo['classes'] == SYNTHETIC_CLASSES
    coco = COCO(osp.join(root, 'annotations', 'instances_train.json'))
    load_img = LoadImageFromFile()
    load_ann = LoadAnnotations(with_bbox=True, with_label=True, with_mask=True)
    for idx in range(len(ds)):
        info = ds.get_data_info(idx)
        assert osp.isfile(info['img_path'])
        assert info['img_path'].startswith(osp.join(root, 'images', 'train'))
        instances = info['instances']
        anns = coco.loadAnns(sorted(coco.getAnnIds(imgIds=info['img_id'])))
        assert len(instances) == len(anns)
        for inst, ann in zip(instances, anns):
            assert inst['mask'] == ann['segmentation']
            assert inst['bbox_label'] == ann['category_id'] - 1
            assert inst['ignore_flag'] == 0
        results = load_ann(load_img(dict(info)))
        masks = results['gt_masks'].to_ndarray().astype(bool)
        assert masks.shape == (len(anns), 64, 80)
        for mask, ann in zip(masks, anns):
            np.testing.assert_array_equal(mask, coco.annToMask(ann).astype(bool))
        np.testing.assert_array_equal(results['gt_bboxes_labels'],
                                      [a['category_id'] - 1 for a in anns])


@pytest.mark.parametrize('reduce_zero_label', [False, True])
def test_mmseg_dataset(dataset, reduce_zero_label):
    from mmseg.datasets import BaseSegDataset
    from mmseg.datasets.transforms import LoadAnnotations
    root, _ = dataset
    if reduce_zero_label:
        metainfo = dict(classes=SYNTHETIC_CLASSES, palette=SYNTHETIC_PALETTE)
    else:
        metainfo = dict(classes=SYNTHETIC_SEG_CLASSES, palette=SYNTHETIC_SEG_PALETTE)
    with DefaultScope.overwrite_default_scope('mmseg'):
        ds = BaseSegDataset(
            data_root=root,
            data_prefix=dict(img_path='images/val', seg_map_path='seg_maps/val'),
            img_suffix='.jpg',
            seg_map_suffix='.png',
            metainfo=metainfo,
            reduce_zero_label=reduce_zero_label,
            pipeline=[],
            lazy_init=False)
    assert len(ds) == 3
    assert ds.metainfo['classes'] == metainfo['classes']
    load = LoadAnnotations()
    values = set()
    for idx in range(len(ds)):
        info = ds.get_data_info(idx)
        name = osp.splitext(osp.basename(info['img_path']))[0]
        assert info['seg_map_path'] == osp.join(root, 'seg_maps', 'val', name + '.png')
        assert info['reduce_zero_label'] is reduce_zero_label
        gt = load(dict(info))['gt_seg_map']
        raw = cv2.imread(info['seg_map_path'], cv2.IMREAD_UNCHANGED)
        expected = np.where(raw == 0, 255, raw - 1) if reduce_zero_label else raw
        np.testing.assert_array_equal(gt, expected)
        values |= set(np.unique(gt).tolist())
    num_classes = len(metainfo['classes'])
    assert values <= set(range(num_classes)) | {255}
    assert (255 in values) is reduce_zero_label


def test_cityscapes_layout(tmp_path):
    """mmseg's CityscapesDataset reads the copy as it reads Cityscapes: 19 classes, every
    image paired with its map, the synthetic labels as Cityscapes train ids."""
    from mmseg.datasets import CityscapesDataset
    from mmseg.datasets.transforms import LoadAnnotations
    root = str(tmp_path / 'syn')
    with pytest.raises(FileNotFoundError, match='no complete synthetic dataset'):
        write_cityscapes_layout(root)
    generate_synthetic_dataset(root, num_train=2, num_val=2, img_size=(48, 64), seed=5)
    tree = write_cityscapes_layout(root)
    assert tree == osp.join(root, 'cityscapes')
    lut = dict(enumerate(SYNTHETIC_CITYSCAPES_TRAIN_IDS))
    for split in ('train', 'val'):
        with DefaultScope.overwrite_default_scope('mmseg'):
            ds = CityscapesDataset(
                data_root=tree,
                data_prefix=dict(img_path=f'leftImg8bit/{split}', seg_map_path=f'gtFine/{split}'),
                pipeline=[],
                lazy_init=False)
        assert len(ds) == 2 and len(ds.metainfo['classes']) == 19
        for idx in range(len(ds)):
            info = ds.get_data_info(idx)
            name = osp.basename(info['img_path']).split('_')[0]
            raw = cv2.imread(osp.join(root, 'seg_maps', split, name + '.png'), -1)
            gt = LoadAnnotations()(dict(info))['gt_seg_map']
            np.testing.assert_array_equal(gt, np.vectorize(lut.get)(raw))
            image = cv2.imread(info['img_path'])
            np.testing.assert_array_equal(
                image, cv2.imread(osp.join(root, 'images', split, name + '.jpg')))
    stamp = osp.getmtime(osp.join(tree, 'meta.json'))
    assert write_cityscapes_layout(root) == tree  # the same generation: nothing rewritten
    assert osp.getmtime(osp.join(tree, 'meta.json')) == stamp


def _load_cli():
    return load_tool('dataset_converters/generate_synthetic_data.py')


def test_cli(tmp_path, capsys):
    cli = _load_cli()
    out = str(tmp_path / 'syn')
    argv = ['--out', out, '--num-train', '2', '--num-val', '1', '--size', '48', '64', '--seed', '1']
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith(f'generated {out}') and 'train: 2 images' in text
    with open(osp.join(out, 'meta.json')) as f:
        assert json.load(f)['args'] == dict(
            num_train=2, num_val=1, img_size=[48, 64], seed=1, max_shapes=4)
    assert cli.main(argv) == 0
    assert 'already complete' in capsys.readouterr().out
    assert cli.main(argv[:-1] + ['2']) == 2
    assert 'seed=1 (requested 2)' in capsys.readouterr().err
    assert cli.main(argv[:-1] + ['2', '--overwrite']) == 0
    assert cli.main(argv[:-1] + ['2', '--cityscapes']) == 0
    assert f"Cityscapes layout: {osp.join(out, 'cityscapes')}" in capsys.readouterr().out
    assert osp.isdir(osp.join(out, 'cityscapes', 'gtFine', 'val'))
    assert cli.main(
        ['--out',
         str(tmp_path / 'sq'), '--num-train', '1', '--num-val', '1', '--size', '40']) == 0
    assert '40x40' in capsys.readouterr().out
