"""Named errors of the backbones and the tools reach the user as one line, without a
traceback, through tools/train.py, tools/test.py and the demo; an oversized Pola-Swin
window is refused before anything is allocated."""
import os.path as osp
import subprocess
import sys

import pytest

from polaformer_mm.models import PolaSwin
from tests import REPO

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
SWIN = osp.join(REPO, 'configs/pola_swin/upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py')


def _last_line(args, cwd):
    proc = subprocess.run(
        [sys.executable] + args, cwd=str(cwd), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def test_oversized_window_is_refused_naming_the_argument():
    with pytest.raises(ValueError) as info:
        PolaSwin(
            arch=dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1]),
            window_size=100,
            pretrain_img_size=64)
    message = str(info.value)
    assert message.startswith("window_size=100 is larger than the map of every 'S' stage "
                              '(stages [2, 3]: 4x4, 2x2 tokens at pretrain_img_size=64)')
    assert 'Use window_size <= 4' in message
    # a window the 'S' maps can hold is taken, as before
    PolaSwin(
        arch=dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1]),
        window_size=4,
        pretrain_img_size=64)


@pytest.mark.slow
@pytest.mark.parametrize('option, expected', [
    ('model.backbone.frozen_stages=9', 'frozen_stages must be in -1..4, got 9'),
    ('model.backbone.arch=huge', "Unknown PolaPVT arch 'huge'"),
    ('model.backbone.out_indices=(7,)', 'out_indices must name stages in 0..3'),
    ('model.backbone.windw_size=7', "unexpected keyword argument 'windw_size'"),
])
def test_backbone_argument_errors_through_train_py(tmp_path, option, expected):
    last = _last_line([
        osp.join(REPO, 'tools/train.py'), DET, '--work-dir', 'wd', '--skip-dataset-check',
        '--cfg-options', option
    ], tmp_path)
    assert last.startswith('train.py: error: PolaPVT (model.backbone): ') and expected in last, \
        last


@pytest.mark.slow
def test_oversized_window_through_test_py(tmp_path):
    ckpt = tmp_path / 'unused.pth'
    ckpt.write_bytes(b'')
    last = _last_line([
        osp.join(REPO, 'tools/test.py'), SWIN,
        str(ckpt), '--work-dir', 'wd', '--cfg-options', 'model.backbone.window_size=100'
    ], tmp_path)
    assert last.startswith(
        'test.py: error: PolaSwin (model.backbone): window_size=100 is larger than the map '
        "of every 'S' stage"), last


@pytest.mark.slow
def test_backbone_argument_error_through_the_demo(synthetic_data_root, tmp_path):
    import glob
    image = sorted(glob.glob(osp.join(synthetic_data_root, 'images/val/*.jpg')))[0]
    last = _last_line([osp.join(REPO, 'tools/demo/image_demo.py'), image,
                       str(tmp_path / 'cfg.py')], _write_config(tmp_path))
    assert last.startswith('image_demo.py: error: PolaPVT (model.backbone): frozen_stages'), last


def _write_config(tmp_path):
    (tmp_path / 'cfg.py').write_text(f'_base_ = [{DET!r}]\n'
                                     "model = dict(backbone=dict(frozen_stages='2'))\n")
    return tmp_path
