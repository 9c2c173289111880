"""tools/gpu_check.py (polaformer_mm.workflows.gpu_check): without a GPU it says so and
exits 2; the parts that decide a report (environment probe, pytest counts, training
configs and the loss verdict) work on this machine."""
import math
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

from polaformer_mm.workflows import gpu_check
from .. import REPO

TOOL = osp.join(REPO, 'tools', 'gpu_check.py')


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='this machine has a GPU')
def test_without_a_gpu_it_says_so(tmp_path):
    proc = subprocess.run(
        [sys.executable, TOOL, '--out-dir', str(tmp_path / 'r')],
        capture_output=True,
        text=True,
        timeout=300)
    assert proc.returncode == 2
    assert 'gpu-check needs a CUDA GPU, and torch sees none' in proc.stderr
    assert not (tmp_path / 'r').exists()


@pytest.mark.slow
def test_probe_of_this_environment():
    probe = gpu_check.probe_environment(sys.executable)
    for name in ('polaformer_mm', 'mmengine', 'mmcv', 'mmdet.models', 'mmseg.models', 'pytest'):
        assert gpu_check._ok(probe[name]), (name, probe[name])
    assert probe['mmcv_ops']['compiled_ops'] is True
    if not torch.version.cuda:
        assert probe['mmcv_ops']['cuda'] is None


def test_cuda_test_files_are_found():
    files = gpu_check.cuda_test_files()
    assert 'tests/test_cuda/test_backbones_cuda.py' in files
    assert 'tests/test_cuda/test_train_amp.py' in files
    # marked through tests/_cuda.py's ``CUDA`` (module-level pytestmark)
    assert 'tests/test_ops/test_pola_attention_cuda.py' in files
    assert 'tests/test_tools/test_gpu_check.py' not in files


def test_pytest_counts(tmp_path):
    xml = tmp_path / 'r.xml'
    xml.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="a" name="ok"/>'
                   '<testcase classname="a" name="bad"><failure message="x"/></testcase>'
                   '<testcase classname="a" name="s1"><skipped message="no GPU"/></testcase>'
                   '<testcase classname="a" name="s2"><skipped message="no GPU"/></testcase>'
                   '</testsuite></testsuites>')
    res = gpu_check._junit_counts(str(xml))
    assert res['counts'] == dict(tests=4, failures=1, errors=0, skipped=2, passed=1)
    assert res['failed'] == ['a::bad'] and res['skipped_reasons'] == {'no GPU': 2}


@pytest.mark.parametrize('task', ['det', 'seg'])
def test_training_config_is_full_size_and_short(task, tmp_path):
    work = tmp_path / 'work' / task
    work.mkdir(parents=True)
    path = gpu_check._train_config(task, '/data/synth/', str(work), iters=50, batch=2)
    cfg = Config.fromfile(path)
    assert cfg.train_cfg == dict(type='IterBasedTrainLoop', max_iters=50, val_interval=10**9)
    assert cfg.val_dataloader is None and cfg.val_cfg is None and cfg.val_evaluator is None
    assert cfg.train_dataloader.batch_size == 2
    assert cfg.train_dataloader.dataset.data_root == '/data/synth/'
    assert cfg.default_hooks.logger.interval == 1
    assert cfg.model.backbone.type == 'PolaPVT'
    if task == 'det':
        resize = [t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'Resize']
        assert resize[0].scale == (1333, 800)
    else:
        assert tuple(cfg.model.data_preprocessor.size) == (800, 1333)


def test_loss_verdict():
    rows = [dict(loss=3.0 - 0.04 * i, time=0.2, memory=900) for i in range(50)]
    v = gpu_check.loss_verdict(rows, 50)
    assert v['status'] == 'passed' and v['falling'] and v['finite']
    assert v['sec_per_iter'] == 0.2 and v['memory_mb'] == 900
    assert v['loss_mean_first'] == pytest.approx(3.0 - 0.04 * 4.5)

    flat = [dict(loss=1.0) for _ in range(50)]
    assert gpu_check.loss_verdict(flat, 50)['reason'] == 'the loss did not fall'
    nan = rows[:49] + [dict(loss=math.nan)]
    assert 'a non-finite loss' in gpu_check.loss_verdict(nan, 50)['reason']
    short = gpu_check.loss_verdict(rows[:30], 50)
    assert short['status'] == 'failed' and '30 of 50 iterations logged' in short['reason']
