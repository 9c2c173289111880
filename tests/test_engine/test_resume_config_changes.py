"""Resume that does not surprise: a changed lr / weight decay is reported (and the config's
value wins on request), another optimizer type is a named error, a model that does not fit the
checkpoint is a named error whose advice trains (with or without --allow-partial), and a copied
or moved work dir resumes from its own files."""
import glob
import os.path as osp
import shutil
import subprocess
import sys

import pytest

from polaformer_mm.engine import entry
from polaformer_mm.engine.checkpoint_fit import CheckpointMismatchError
from polaformer_mm.utils.checkpoint_io import CheckpointError
from tests import REPO

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')

pytestmark = pytest.mark.slow


def _cfg(data_root, work_dir, resume=None, allow_partial=False, **options):
    cfg = entry.load_config(DET)
    ann = data_root + 'annotations/instances_val.json'
    cfg.merge_from_dict({
        'train_dataloader.dataset.data_root': data_root,
        'train_dataloader.dataset.indices': 2,
        'train_dataloader.batch_size': 2,
        'val_dataloader.dataset.data_root': data_root,
        'test_dataloader.dataset.data_root': data_root,
        'val_evaluator.ann_file': ann,
        'test_evaluator.ann_file': ann,
        'train_cfg.max_epochs': 1,
        'train_cfg.val_interval': 100,
        'default_hooks.checkpoint.interval': 1,
        'default_hooks.logger.interval': 1,
        **options
    })
    return entry.prepare_train_config(
        cfg, DET, work_dir=str(work_dir), resume=resume, allow_partial=allow_partial)


@pytest.fixture(scope='module')
def trained(synthetic_data_root, tmp_path_factory):
    """A work dir after one epoch of AdamW at lr 1e-3, weight decay 0.05."""
    work_dir = tmp_path_factory.mktemp('trained') / 'A'
    entry.build_runner(_cfg(synthetic_data_root, work_dir)).train()
    assert osp.isfile(work_dir / 'epoch_1.pth')
    return work_dir


def _copy(src, dst):
    shutil.copytree(str(src), str(dst), symlinks=True)
    return dst


def _log(work_dir):
    logs = sorted(glob.glob(osp.join(str(work_dir), '*', '*.log')))
    with open(logs[-1]) as f:
        return f.read()


def _group(runner):
    return runner.optim_wrapper.optimizer.param_groups[0]


@pytest.mark.parametrize('winner', ['checkpoint', 'config'])
def test_changed_lr_and_weight_decay_are_reported(synthetic_data_root, trained, tmp_path, winner):
    work_dir = _copy(trained, tmp_path / 'B')
    options = {
        'train_cfg.max_epochs': 2,
        'optim_wrapper.optimizer.lr': 1e-6,
        'optim_wrapper.optimizer.weight_decay': 0.1
    }
    if winner == 'config':
        options['resume_optimizer_from'] = 'config'
    runner = entry.build_runner(_cfg(synthetic_data_root, work_dir, resume='auto', **options))
    runner.train()
    log = _log(work_dir)
    ckpt = osp.join(str(work_dir), 'epoch_1.pth')
    assert (f'--resume {ckpt}: lr 1e-06 (config) / 0.001 (checkpoint), weight_decay 0.1 '
            '(config) / 0.05 (checkpoint).') in log
    if winner == 'checkpoint':
        assert "The checkpoint's values are used" in log
        assert '--cfg-options resume_optimizer_from=config' in log
        assert _group(runner)['initial_lr'] == 1e-3 and _group(runner)['weight_decay'] == 0.05
    else:
        assert "The config's values are used" in log
        assert _group(runner)['initial_lr'] == pytest.approx(1e-6)
        assert _group(runner)['weight_decay'] == 0.1
        assert _group(runner)['lr'] < 1e-6  # the schedule went on, scaled to the new lr
    assert runner.epoch == 2


def test_another_optimizer_type_is_a_named_error(synthetic_data_root, trained, tmp_path):
    work_dir = _copy(trained, tmp_path / 'B')
    cfg = _cfg(synthetic_data_root, work_dir, resume='auto', **{'train_cfg.max_epochs': 2})
    cfg.optim_wrapper.optimizer = dict(type='SGD', lr=0.01, momentum=0.9)
    with pytest.raises(CheckpointError) as info:
        entry.build_runner(cfg).train()
    message = str(info.value)
    assert 'optim_wrapper.optimizer.type=SGD but the checkpoint holds the state of AdamW' in message
    assert f'load_from={work_dir / "epoch_1.pth"} without --resume' in message


def test_another_optimizer_type_through_train_py_has_no_traceback(synthetic_data_root, trained,
                                                                  tmp_path):
    work_dir = _copy(trained, tmp_path / 'B')
    data_root = synthetic_data_root
    config = tmp_path / 'sgd.py'
    config.write_text(
        f'_base_ = [{DET!r}]\n'
        f'train_dataloader = dict(dataset=dict(data_root={data_root!r}, indices=2))\n'
        f'val_dataloader = dict(dataset=dict(data_root={data_root!r}))\n'
        f"val_evaluator = dict(ann_file={data_root + 'annotations/instances_val.json'!r})\n"
        'train_cfg = dict(max_epochs=2, val_interval=100)\n'
        "optim_wrapper = dict(optimizer=dict(_delete_=True, type='SGD', lr=0.01, momentum=0.9))\n")
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/train.py'),
        str(config), '--work-dir',
        str(work_dir), '--resume'
    ],
                          capture_output=True,
                          text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr and 'KeyError' not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('train.py: error: --resume ') and 'state of AdamW' in last, last


@pytest.mark.parametrize('how', ['copied', 'moved'])
def test_copied_or_moved_work_dir_resumes_from_its_own_files(synthetic_data_root, trained, tmp_path,
                                                             how):
    source = _copy(trained, tmp_path / 'A')
    named = osp.join(str(source), 'epoch_1.pth')
    with open(source / 'last_checkpoint', 'w') as f:  # as a run in A writes it
        f.write(named)
    work_dir = _copy(source, tmp_path / 'B')
    with open(work_dir / 'last_checkpoint') as f:
        assert f.read().strip() == named  # an absolute path into A
    if how == 'moved':
        shutil.rmtree(str(source))
    runner = entry.build_runner(
        _cfg(synthetic_data_root, work_dir, resume='auto', **{'train_cfg.max_epochs': 2}))
    runner.train()
    own = osp.join(str(work_dir), 'epoch_1.pth')
    assert runner._load_from == own
    assert f'which is not in this work dir (it was copied or moved): resuming from {own}' in \
        _log(work_dir)
    assert runner.epoch == 2 and osp.isfile(work_dir / 'epoch_2.pth')
    with open(work_dir / 'last_checkpoint') as f:
        assert f.read().strip() == osp.join(str(work_dir), 'epoch_2.pth')


@pytest.mark.parametrize('allow_partial', [False, True], ids=['strict', 'allow-partial'])
def test_a_model_that_does_not_fit_cannot_resume_and_the_advice_trains(
        synthetic_data_root, trained, tmp_path, allow_partial):
    """--resume into another head width (the RPN head's 64 channels made 32): named before
    anything is restored (with --allow-partial too, where the optimizer state would fail in
    torch: 'loaded state dict contains a parameter group that doesn't match'); its advice,
    a new run from the weights that fit, trains."""
    work_dir = _copy(trained, tmp_path / 'B')
    narrow = {'model.rpn_head.feat_channels': 32, 'train_cfg.max_epochs': 2}
    cfg = _cfg(synthetic_data_root, work_dir, resume='auto', allow_partial=allow_partial, **narrow)
    with pytest.raises(CheckpointMismatchError) as info:
        entry.build_runner(cfg).train()
    ckpt = str(work_dir / 'epoch_1.pth')
    message = str(info.value)
    assert 'rpn_head.rpn_conv.weight: checkpoint [64, 64, 3, 3] vs model [32, 64, 3, 3]' in message
    assert ('A run resumes only the model it was saved from (its optimizer state and schedule '
            'belong to those parameters), with or without --allow-partial.') in message
    assert (f'start a new run: --cfg-options load_from={ckpt} --allow-partial without --resume'
            in message)
    assert not osp.exists(work_dir / 'epoch_2.pth')
    # followed as written: load_from, --allow-partial, no --resume
    runner = entry.build_runner(
        _cfg(
            synthetic_data_root,
            tmp_path / 'C',
            allow_partial=True,
            **dict(narrow, load_from=ckpt, **{'train_cfg.max_epochs': 1})))
    runner.train()
    assert osp.isfile(tmp_path / 'C' / 'epoch_1.pth')
