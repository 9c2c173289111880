"""Images that cannot be read or resized are named (file and reason) by tools/train.py,
tools/test.py and the demo, without a traceback; ``check_dataset.py --deep`` finds empty,
cut-short and mis-sized images and segmentation maps before anything runs."""
import json
import os.path as osp
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest

from tests import REPO

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
SEG = osp.join(REPO, 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py')

pytestmark = pytest.mark.slow


@pytest.fixture
def data(synthetic_data_root, tmp_path):
    """A copy of the synthetic dataset that the test may break."""
    root = str(tmp_path / 'data')
    shutil.copytree(synthetic_data_root, root)
    return root + '/'


def _coco(root, split):
    with open(osp.join(root, f'annotations/instances_{split}.json')) as f:
        return json.load(f)


def _image(root, split, index=0):
    return osp.join(root, 'images', split, _coco(root, split)['images'][index]['file_name'])


def _options(root):
    ann = root + 'annotations/instances_val.json'
    opts = [
        f'train_dataloader.dataset.data_root={root}', 'train_dataloader.batch_size=2',
        f'val_dataloader.dataset.data_root={root}', f'test_dataloader.dataset.data_root={root}',
        f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}', 'train_cfg.max_epochs=1',
        'train_cfg.val_interval=5'
    ]
    return opts


def _run(args, cwd):
    proc = subprocess.run(
        [sys.executable] + args, cwd=str(cwd), capture_output=True, text=True, timeout=600)
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    return proc.returncode, (lines[-1] if lines else ''), proc.stdout


def test_zero_byte_image_in_training_is_named(data, tmp_path):
    bad = _image(data, 'train', 1)
    open(bad, 'wb').close()
    code, last, _ = _run([
        osp.join(REPO, 'tools/train.py'), DET, '--work-dir', 'wd', '--cfg-options', *_options(data)
    ], tmp_path)
    assert code == 1
    assert last.startswith(f'train.py: error: image {bad}: the file is empty (0 bytes)'), last


def test_image_too_narrow_to_resize_in_training_is_named(data, tmp_path):
    """A 4000 x 16 image that the quickstart's Resize to 64 x 64 would shrink to 0.26
    pixels high (min_size=0 keeps it in the data)."""
    coco = _coco(data, 'train')
    entry = coco['images'][0]
    bad = osp.join(data, 'images/train', entry['file_name'])
    cv2.imwrite(bad, np.full((16, 4000, 3), 127, np.uint8))
    entry.update(width=4000, height=16)
    for ann in coco['annotations']:
        if ann['image_id'] == entry['id']:
            ann.update(bbox=[1, 1, 8, 8], area=64, segmentation=[[1, 1, 9, 1, 9, 9, 1, 9]])
    with open(osp.join(data, 'annotations/instances_train.json'), 'w') as f:
        json.dump(coco, f)
    code, last, _ = _run([
        osp.join(REPO, 'tools/train.py'), DET, '--work-dir', 'wd', '--cfg-options', *_options(data),
        'train_dataloader.dataset.filter_cfg.min_size=0', 'train_dataloader.sampler.shuffle=False'
    ], tmp_path)
    assert code == 1
    assert last.startswith(f'train.py: error: image {bad} (4000x16 pixels, W x H): the '
                           'transform Resize failed: a side would be resized below one pixel'), last


def test_undecodable_image_in_testing_is_named(data, tmp_path):
    bad = _image(data, 'val', 0)
    with open(bad, 'wb') as f:
        f.write(b'this is not an image\n' * 10)
    ckpt = tmp_path / 'weights.pth'
    _save_random_weights(ckpt)
    code, last, _ = _run([
        osp.join(REPO, 'tools/test.py'), DET,
        str(ckpt), '--work-dir', 'wd', '--cfg-options', *_options(data)
    ], tmp_path)
    assert code == 1
    assert last.startswith(f'test.py: error: image {bad}: it cannot be decoded as an image'), last


def _save_random_weights(path):
    import torch

    from polaformer_mm.engine import entry
    cfg = entry.load_config(DET)
    from mmdet.registry import MODELS
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, str(path))


@pytest.mark.parametrize('kind', ['empty', 'truncated'])
def test_demo_names_an_unreadable_image(data, tmp_path, kind):
    bad = tmp_path / f'{kind}.jpg'
    with open(_image(data, 'val', 0), 'rb') as f:
        content = f.read()
    bad.write_bytes(b'' if kind == 'empty' else content[:len(content) // 2])
    code, last, _ = _run([osp.join(REPO, 'tools/demo/image_demo.py'), str(bad), DET], tmp_path)
    assert code == 1
    reason = ('the file is empty (0 bytes)'
              if kind == 'empty' else 'it is truncated (a JPEG without its end marker)')
    assert last == f'image_demo.py: error: image {bad}: {reason}', last


def test_deep_dataset_check_finds_empty_truncated_and_missized_files(data, tmp_path):
    coco = _coco(data, 'train')
    names = [im['file_name'] for im in coco['images']]
    empty, cut, resized = (osp.join(data, 'images/train', n) for n in names[:3])
    open(empty, 'wb').close()
    with open(cut, 'rb') as f:
        content = f.read()
    with open(cut, 'wb') as f:
        f.write(content[:len(content) // 2])
    cv2.imwrite(resized, np.zeros((50, 70, 3), np.uint8))
    check = osp.join(REPO, 'tools/misc/check_dataset.py')
    opts = ['--cfg-options', *_options(data)[:5]]
    # without --deep no image is opened: nothing found
    code, _, out = _run([check, DET, '--splits', 'train', *opts], tmp_path)
    assert code == 0, out
    code, _, out = _run([check, DET, '--splits', 'train', '--deep', *opts], tmp_path)
    assert code == 1, out
    assert f'{names[0]}: empty (0 bytes)' in out
    assert f'{names[1]}: truncated (a JPEG without its end marker)' in out
    assert f'{names[2]}: 70x50, annotated 144x112' in out


def test_deep_dataset_check_finds_a_segmentation_map_of_another_size(data, tmp_path):
    seg_dir = osp.join(data, 'seg_maps/train')
    name = sorted(n for n in __import__('os').listdir(seg_dir) if n.endswith('.png'))[0]
    cv2.imwrite(osp.join(seg_dir, name), np.zeros((30, 40), np.uint8))
    check = osp.join(REPO, 'tools/misc/check_dataset.py')
    code, _, out = _run([
        check, SEG, '--splits', 'train', '--deep', '--cfg-options',
        f'train_dataloader.dataset.data_root={data}'
    ], tmp_path)
    assert code == 1, out
    assert f'{name}: 40x30, image 144x112' in out
    assert 'segmentation maps of another size (W x H) than their image' in out
