"""Every ImageNet config: one training iteration (with its Mixup / CutMix, RandAugment and
random erasing) and one validation pass with its Accuracy metric, on crops of the synthetic
shapes at 64x64 (tests/_smoke.py)."""
import glob
import math
import os.path as osp

import pytest

from polaformer_mm.engine import entry
from tests import REPO
from .._smoke import classification_root, configs_to_train, smoke_classification_config
from .test_dense_configs_train import MetricsCatcher

IMAGENET = sorted(glob.glob(osp.join(REPO, 'configs', 'imagenet', '*.py')))


@pytest.fixture(scope='module')
def data_root(tmp_path_factory):
    return classification_root(tmp_path_factory.mktemp('data'))


def test_imagenet_configs_found():
    assert len(IMAGENET) == 26, IMAGENET


@pytest.mark.slow
@pytest.mark.parametrize('path', configs_to_train(IMAGENET), ids=lambda p: osp.basename(p))
def test_one_iteration_and_validation(path, data_root, tmp_path):
    cfg = entry.load_config(path)
    smoke_classification_config(cfg, data_root, tmp_path)
    runner = entry.build_runner(cfg)
    seen = MetricsCatcher()
    runner.register_hook(seen)
    runner.train()
    assert runner.iter == 1
    assert math.isfinite(runner.message_hub.log_scalars['train/loss'].current())
    assert 'accuracy/top1' in seen.metrics, seen.metrics
