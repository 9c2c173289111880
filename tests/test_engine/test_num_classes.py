"""Heads whose num_classes disagree with the data's classes are named before a run starts
(both numbers and both config keys), by the runner and through tools/train.py."""
import os.path as osp
import subprocess
import sys

import pytest

from polaformer_mm.engine import entry
from polaformer_mm.engine.model_check import ModelConfigError
from tests import REPO

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
SEG = osp.join(REPO, 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py')


def _runner(config, data_root, work_dir, **options):
    cfg = entry.load_config(config)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = data_root
    cfg.merge_from_dict(options)
    entry.prepare_train_config(cfg, config, work_dir=str(work_dir))
    return entry.build_runner(cfg)


def test_detector_heads_with_fewer_classes_than_the_data(synthetic_data_root, tmp_path):
    runner = _runner(DET, synthetic_data_root, tmp_path,
                     **{'model.roi_head.bbox_head.num_classes': 2})
    with pytest.raises(ModelConfigError) as info:
        runner.train()
    assert str(info.value) == (
        'model.roi_head.bbox_head.num_classes=2 but the train data has 3 classes '
        "(train_dataloader.dataset.metainfo.classes=('circle', 'square', 'triangle')): set "
        'model.roi_head.bbox_head.num_classes to 3, or give the dataset the classes the heads '
        'predict (train_dataloader.dataset.metainfo.classes)')


def test_segmentor_with_more_classes_than_the_data_when_testing(synthetic_data_root, tmp_path):
    runner = _runner(SEG, synthetic_data_root, tmp_path, **{'model.decode_head.num_classes': 6})
    with pytest.raises(
            ModelConfigError,
            match=r'model.decode_head.num_classes=6 but the test '
            r'data has 4 classes \(test_dataloader.dataset.metainfo.classes='):
        runner.test()


def test_the_quickstart_configs_pass(synthetic_data_root, tmp_path):
    from polaformer_mm.engine.class_check import check_num_classes
    for config in (DET, SEG):
        runner = _runner(config, synthetic_data_root, tmp_path / osp.basename(config))
        check_num_classes(runner.model, runner.cfg, ('train', 'val', 'test'))


@pytest.mark.slow
def test_train_py_names_it_in_one_line(synthetic_data_root, tmp_path):
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/train.py'), DET, '--work-dir', 'wd', '--cfg-options',
        f'train_dataloader.dataset.data_root={synthetic_data_root}',
        f'val_dataloader.dataset.data_root={synthetic_data_root}',
        f'val_evaluator.ann_file={synthetic_data_root}annotations/instances_val.json',
        'model.roi_head.mask_head.num_classes=5'
    ],
                          cwd=str(tmp_path),
                          capture_output=True,
                          text=True,
                          timeout=600)
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('train.py: error: model.roi_head.mask_head.num_classes=5 but the '
                           'train data has 3 classes'), last
