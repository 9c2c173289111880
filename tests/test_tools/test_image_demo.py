"""tools/demo/image_demo.py on a real photograph (matplotlib's sample image) with the
quickstart-sized detection and segmentation configs."""
import glob
import importlib.util
import json
import os.path as osp
import warnings

import matplotlib
import mmcv
import numpy as np
import pytest
import torch
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
IMAGE = osp.join(matplotlib.get_data_path(), 'sample_data', 'grace_hopper.jpg')


def _load_demo():
    spec = importlib.util.spec_from_file_location('image_demo',
                                                  osp.join(ROOT, 'tools', 'demo', 'image_demo.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = _load_demo()


def _quickstart_config(scope):
    """The first quickstart config of the given default scope."""
    for path in sorted(glob.glob(osp.join(ROOT, 'configs', 'quickstart', '*.py'))):
        if Config.fromfile(path).get('default_scope') == scope:
            return path
    pytest.fail(f'no {scope} config in configs/quickstart/')


def test_detection_random_weights_warns_and_writes(tmp_path):
    config = _quickstart_config('mmdet')
    with pytest.warns(UserWarning, match='RANDOM'):
        out = demo.main(
            [IMAGE, config, '--out-dir',
             str(tmp_path), '--device', 'cpu', '--score-thr', '0.05'])
    image = mmcv.imread(IMAGE)
    assert out['vis'] == str(tmp_path / 'vis' / 'grace_hopper.jpg')
    assert mmcv.imread(out['vis']).shape == image.shape
    with open(out['pred']) as f:
        pred = json.load(f)
    classes = Config.fromfile(config).test_dataloader.dataset.metainfo['classes']
    assert pred['classes'] == list(classes)  # the config's, not mmdet's COCO fallback
    assert pred['image_shape'] == list(image.shape[:2])
    n = len(pred['scores'])
    assert len(pred['labels']) == len(pred['bboxes']) == n
    assert all(s >= 0.05 for s in pred['scores'])
    assert all(0 <= label < len(classes) for label in pred['labels'])
    for x1, y1, x2, y2 in pred['bboxes']:
        assert 0 <= x1 <= x2 <= image.shape[1] and 0 <= y1 <= y2 <= image.shape[0]


def test_segmentation_uses_the_given_weights(tmp_path):
    config = _quickstart_config('mmseg')
    cfg = Config.fromfile(config)
    # a checkpoint whose classifier votes for class 2 everywhere, without dataset_meta
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        model = demo.build_inferencer(cfg, 'mmseg', None, 'cpu').model
    with torch.no_grad():
        model.decode_head.conv_seg.weight.zero_()
        model.decode_head.conv_seg.bias.fill_(-5.).index_fill_(0, torch.tensor([2]), 5.)
    ckpt = tmp_path / 'seg.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, ckpt)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        out = demo.main([
            IMAGE, config, '--weights',
            str(ckpt), '--out-dir',
            str(tmp_path / 'out'), '--device', 'cpu'
        ])
    assert not [w for w in caught if 'RANDOM' in str(w.message)]
    image = mmcv.imread(IMAGE)
    assert mmcv.imread(out['vis']).shape == image.shape
    with open(out['pred']) as f:
        pred = json.load(f)
    seg = np.array(pred['sem_seg'])
    assert seg.shape == image.shape[:2]
    assert (seg == 2).all()
    assert pred['classes'] == list(cfg.test_dataloader.dataset.metainfo['classes'])


def test_rejects_classification_configs_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match='mmpretrain'):
        demo.main([
            IMAGE,
            osp.join(ROOT, 'configs/imagenet/pola-pvt-tiny_8xb128_in1k.py'), '--out-dir',
            str(tmp_path)
        ])
    config = _quickstart_config('mmseg')
    with pytest.raises(FileNotFoundError, match='missing.pth'):
        demo.main([IMAGE, config, '--weights', str(tmp_path / 'missing.pth')])
    with pytest.raises(FileNotFoundError, match='nothing.jpg'):
        demo.main([str(tmp_path / 'nothing.jpg'), config])
