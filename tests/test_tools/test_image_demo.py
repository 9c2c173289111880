"""tools/demo/image_demo.py on a real photograph (matplotlib's sample image) with the
quickstart-sized detection and segmentation configs: predictions, strict loading of
``--weights`` (``--allow-partial`` to opt out), DDP-saved weights, named errors."""
import glob
import json
import os.path as osp
import subprocess
import sys
import warnings

import matplotlib
import mmcv
import numpy as np
import pytest
import torch
from mmengine.config import Config

from polaformer_mm.engine import CheckpointMismatchError
from polaformer_mm.engine.checkpoint_fit import PARTIAL_HINT
from tests import REPO
from .._ddp import ddp_state_dict
from .._tools import load_tool

IMAGE = osp.join(matplotlib.get_data_path(), 'sample_data', 'grace_hopper.jpg')

demo = load_tool('demo/image_demo.py')


def _quickstart_config(scope):
    """The first quickstart config of the given default scope."""
    for path in sorted(glob.glob(osp.join(REPO, 'configs', 'quickstart', '*.py'))):
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
            osp.join(REPO, 'configs/imagenet/pola-pvt-tiny_8xb128_in1k.py'), '--out-dir',
            str(tmp_path)
        ])
    config = _quickstart_config('mmseg')
    with pytest.raises(FileNotFoundError, match='missing.pth'):
        demo.main([IMAGE, config, '--weights', str(tmp_path / 'missing.pth')])
    with pytest.raises(FileNotFoundError, match='nothing.jpg'):
        demo.main([str(tmp_path / 'nothing.jpg'), config])


def _run_cli(args, cwd):
    proc = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', 'demo', 'image_demo.py')] + args,
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope='module')
def det_weights(tmp_path_factory):
    """Checkpoints for the quickstart detector: its own weights (plain and saved from a
    DDP wrapper), its backbone only, and a segmentor's."""
    out = tmp_path_factory.mktemp('weights')
    config = _quickstart_config('mmdet')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        model = demo.build_inferencer(Config.fromfile(config), 'mmdet', None, 'cpu').model
        seg = demo.build_inferencer(
            Config.fromfile(_quickstart_config('mmseg')), 'mmseg', None, 'cpu').model
    paths = {k: str(out / f'{k}.pth') for k in ('whole', 'ddp', 'backbone', 'segmentor')}
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, paths['whole'])
    torch.save({'state_dict': ddp_state_dict(model), 'meta': {}}, paths['ddp'])
    torch.save(
        {'state_dict': {
            k: v
            for k, v in model.state_dict().items() if k.startswith('backbone.')
        }}, paths['backbone'])
    torch.save({'state_dict': seg.state_dict()}, paths['segmentor'])
    return config, paths


@pytest.mark.slow
def test_weights_that_do_not_fit_stop_the_demo_as_they_stop_test_py(det_weights, tmp_path):
    config, paths = det_weights
    code, out, err = _run_cli(
        [IMAGE, config, '--weights', paths['backbone'], '--out-dir', 'out', '--device', 'cpu'],
        tmp_path)
    assert code == 1, out + err
    assert 'Traceback' not in err
    assert f"image_demo.py: error: weights '{paths['backbone']}' does not fit the model " \
           '(MaskRCNN)' in err
    assert 'Likely cause: a backbone-only file' in err and 'missing keys' in err
    assert '--allow-partial' in err
    assert not (tmp_path / 'out').exists()  # nothing drawn from a half-random model

    with pytest.raises(CheckpointMismatchError) as info:  # another architecture
        demo.main([IMAGE, config, '--weights', paths['segmentor'], '--device', 'cpu'])
    assert 'a segmentation checkpoint (decode_head) for a detection model' in str(info.value)
    # the rule and the message of tools/test.py (PolaRunner): the same function decides
    assert PARTIAL_HINT in str(info.value)


def test_allow_partial_loads_what_fits_and_says_the_rest_is_random(det_weights, tmp_path, capfd):
    config, paths = det_weights
    with pytest.warns(UserWarning, match='RANDOM'):
        out = demo.main([
            IMAGE, config, '--weights', paths['backbone'], '--allow-partial', '--out-dir',
            str(tmp_path), '--device', 'cpu'
        ])
    err = capfd.readouterr().err
    assert demo.PARTIAL_WEIGHTS_WARNING in err and 'a backbone-only file' in err
    assert osp.isfile(out['vis']) and osp.isfile(out['pred'])


def test_ddp_saved_weights_predict_as_the_plain_file(det_weights, tmp_path):
    config, paths = det_weights
    preds = []
    for kind in ('whole', 'ddp'):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            out = demo.main([
                IMAGE, config, '--weights', paths[kind], '--out-dir',
                str(tmp_path / kind), '--device', 'cpu', '--score-thr', '0'
            ])
        assert not [w for w in caught if 'RANDOM' in str(w.message)]
        with open(out['pred']) as f:
            preds.append(json.load(f))
    assert preds[0]['scores'] and preds[0] == preds[1]


@pytest.mark.slow
def test_an_image_the_pipeline_cannot_resize_is_named(tmp_path):
    config = _quickstart_config('mmdet')
    wide, tall = tmp_path / 'wide.png', tmp_path / 'tall.png'
    mmcv.imwrite(np.full((10, 10000, 3), 128, np.uint8), str(wide))
    mmcv.imwrite(np.full((10000, 10, 3), 128, np.uint8), str(tall))
    code, out, err = _run_cli([str(wide), config, '--device', 'cpu'], tmp_path)
    assert code == 1, out + err
    assert 'Traceback' not in err and 'inv_scale' not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f'image_demo.py: error: image {wide} is 10000x10 pixels (W x H): '
                           "the test pipeline's Resize(scale=")
    assert 'a side below one pixel' in last and '1000:1' in last
    with pytest.raises(demo.DemoInputError, match=r'is 10x10000 pixels .* a side below one'):
        demo.main([str(tall), config, '--device', 'cpu', '--out-dir', str(tmp_path / 'o')])


def test_a_resize_the_check_does_not_know_fails_with_a_named_error(tmp_path):
    """A ``scale_factor`` Resize is not computed ahead; cv2's failure is named all the same."""
    config = tmp_path / 'tiny_scale.py'
    config.write_text(f"_base_ = [{_quickstart_config('mmdet')!r}]\n"
                      "test_dataloader = dict(dataset=dict(pipeline=[\n"
                      "    dict(type='LoadImageFromFile'),\n"
                      "    dict(type='Resize', scale_factor=0.0001, keep_ratio=False),\n"
                      "    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', "
                      "'ori_shape', 'img_shape', 'scale_factor'))]))\n")
    image = mmcv.imread(IMAGE)
    with pytest.raises(demo.DemoInputError) as info:
        demo.main([IMAGE, str(config), '--device', 'cpu', '--out-dir', str(tmp_path / 'o')])
    assert str(info.value).startswith(
        f'the test pipeline failed on image {IMAGE} ({image.shape[1]}x{image.shape[0]} '
        'pixels, W x H): ')
    assert '\n' not in str(info.value)
