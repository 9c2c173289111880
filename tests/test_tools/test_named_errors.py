"""Bad input to the tools ends with one line naming the problem, not a traceback: a neck
that does not take the backbone's channels, converter DST a directory, ``get_flops
--shape`` below one pixel, ``reproduce.py --gpus`` that cannot keep the protocol batch."""
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.registry import DefaultScope

from polaformer_mm.engine import entry
from polaformer_mm.engine.model_check import ModelConfigError, check_model_channels
from tests import REPO
from ..test_models._golden import load_golden
from ..test_models._official_files import save_official

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
UPERNET = osp.join(REPO, 'configs/pola_swin/upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py')


def _tool(args, cwd):
    proc = subprocess.run(
        [sys.executable] + args, cwd=str(cwd), capture_output=True, text=True, timeout=600)
    lines = proc.stderr.strip().splitlines()
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, lines[-1] if lines else ''


@pytest.mark.slow
def test_train_names_a_neck_that_does_not_take_the_backbone_channels(tmp_path):
    # Pola-PVT-T's channels for the quickstart's Pola-PVT-nano backbone
    code, last = _tool([
        osp.join(REPO, 'tools/train.py'), DET, '--work-dir', 'wd', '--skip-dataset-check',
        '--cfg-options', 'model.neck.in_channels=[64,128,320,512]'
    ], tmp_path)
    assert code == 1
    assert last == ('train.py: error: model.neck.in_channels=[64, 128, 320, 512] (FPN) does '
                    'not match the channels [32, 64, 160, 256] of the maps that model.backbone '
                    '(PolaPVT with out_indices=(0, 1, 2, 3)) returns: set '
                    'model.neck.in_channels=[32, 64, 160, 256] or change '
                    'model.backbone.out_indices')


def _segmentor(**changes):
    """The UperNet Pola-Swin-T segmentor (no neck), ``changes`` applied to its config."""
    from mmseg.registry import MODELS
    cfg = entry.load_config(UPERNET)
    cfg.model.backbone.init_cfg = None
    for key, value in changes.items():
        head, leaf = key.split('.')
        cfg.model[head][leaf] = value
    with DefaultScope.overwrite_default_scope('mmseg'):
        return MODELS.build(cfg.model)


def test_segmentation_heads_without_a_neck_are_checked():
    check_model_channels(_segmentor())  # the config as released fits
    with pytest.raises(ModelConfigError) as info:
        check_model_channels(_segmentor(**{'decode_head.in_channels': [64, 128, 256, 512]}))
    assert str(info.value) == (
        'model.decode_head.in_channels=[64, 128, 256, 512] (UPerHead, in_index=[0, 1, 2, 3]) '
        'does not match the channels [96, 192, 384, 768] of those maps of model.backbone '
        '(PolaSwin with out_indices=(0, 1, 2, 3)) (all maps: [96, 192, 384, 768]): set '
        'model.decode_head.in_channels=[96, 192, 384, 768]')
    with pytest.raises(
            ModelConfigError,
            match=r'model\.auxiliary_head\.in_channels=256 '
            r'\(FCNHead, in_index=2\) .* set model\.auxiliary_head\.in_channels=384'):
        check_model_channels(_segmentor(**{'auxiliary_head.in_channels': 256}))
    with pytest.raises(ModelConfigError, match=r'model\.auxiliary_head\.in_index=7 names maps'):
        check_model_channels(_segmentor(**{'auxiliary_head.in_index': 7}))


@pytest.mark.slow
def test_converter_names_a_directory_as_dst(golden_dir, tmp_path):
    src = save_official(tmp_path / 'official.pth',
                        load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')['state_dict'])
    (tmp_path / 'out').mkdir()
    code, last = _tool(
        [osp.join(REPO, 'tools/model_converters/official2mm.py'),
         str(src),
         str(tmp_path / 'out')], tmp_path)
    assert code == 1
    assert last == (f"official2mm: error: DST '{tmp_path / 'out'}' is an existing directory: "
                    f"give the path of the file to write, e.g. "
                    f"'{tmp_path / 'out' / 'converted.pth'}'")
    assert not list((tmp_path / 'out').iterdir())


@pytest.mark.slow
def test_get_flops_names_a_shape_below_one_pixel(tmp_path):
    code, last = _tool([
        osp.join(REPO, 'tools/analysis_tools/get_flops.py'),
        osp.join(REPO, 'configs/pola_pvt/retinanet_pola-pvt-t_fpn_1x_coco.py'), '--shape', '-5', '5'
    ], tmp_path)
    assert code == 2
    assert last == ('get_flops.py: error: --shape -5 5: sizes must be positive pixel counts '
                    '(H W, or one size for a square)')


@pytest.mark.slow
def test_reproduce_names_the_gpu_counts_it_takes(tmp_path):
    code, last = _tool([
        osp.join(REPO, 'tools/reproduce.py'), 'mask-rcnn-1x', '--arch', 'pvt-t', '--gpus', '3',
        '--dry-run', '--work-root',
        str(tmp_path / 'runs')
    ], tmp_path)
    assert code == 1
    assert last == ('reproduce.py: error: --gpus 3: the protocol batch of '
                    'mask-rcnn_pola-pvt-t_fpn_1x_coco.py (8 GPUs x 2 images = 16) does not '
                    'split evenly over 3 GPUs; --gpus takes a divisor of 16 here (1, 2, 4, 8, '
                    '16), or set train_dataloader.batch_size in --cfg-options')
    assert not (tmp_path / 'runs').exists()
