"""The divergence guard: a run whose loss is not finite stops with one message and writes
no checkpoint of non-finite weights; ``divergence_guard = False`` trains on; the Pola op's
non-finite-input error names the layer; ``tools/test.py`` warns about such checkpoints."""
import glob
import os.path as osp
import subprocess
import sys

import pytest
import torch

from polaformer_mm.engine import TrainingDivergedError, entry
from tests import REPO

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')

pytestmark = pytest.mark.slow


def _config(tmp_path, data_root, epochs, extra=''):
    """A config file: the quickstart Mask R-CNN on the synthetic data, ``epochs`` epochs of
    2 iterations, a checkpoint every epoch, no validation; ``extra`` lines at the end."""
    path = tmp_path / 'cfg.py'
    ann = data_root + 'annotations/instances_val.json'
    path.write_text(
        f'_base_ = [{DET!r}]\n'
        f'data_root = {data_root!r}\n'
        'train_dataloader = dict(batch_size=1, dataset=dict(data_root=data_root, indices=2))\n'
        'val_dataloader = dict(dataset=dict(data_root=data_root))\n'
        'test_dataloader = dict(dataset=dict(data_root=data_root, indices=1))\n'
        f'val_evaluator = dict(ann_file={ann!r})\n'
        'test_evaluator = val_evaluator\n'
        f'train_cfg = dict(max_epochs={epochs}, val_interval={epochs + 1})\n'
        'default_hooks = dict(logger=dict(interval=1), '
        'checkpoint=dict(interval=1, max_keep_ckpts=10))\n'
        'param_scheduler = []\n'
        'randomness = dict(seed=0)\n' + extra)
    return str(path)


# softmax stages, SGD at lr 1e3 without gradient clipping: the loss is not finite within a
# few iterations
_DIVERGING = ("model = dict(backbone=dict(attn_types='SSSS'))\n"
              'optim_wrapper = dict(optimizer=dict(_delete_=True, type=\'SGD\', lr=1000.0, '
              'momentum=0.9), clip_grad=None)\n')


def _run(tool, args, cwd):
    return subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', tool)] + args,
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=900)


def _checkpoints(work_dir):
    return sorted(glob.glob(osp.join(str(work_dir), '*.pth')))


def _non_finite(path):
    state = torch.load(path, map_location='cpu', weights_only=True)['state_dict']
    return [k for k, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]


def test_diverging_softmax_run_stops_with_one_message(synthetic_data_root, tmp_path):
    """Softmax stages (no Pola op to trip over): the guard alone stops the run."""
    config = _config(tmp_path, synthetic_data_root, epochs=6, extra=_DIVERGING)
    proc = _run('train.py', [config, '--work-dir', 'wd'], tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('train.py: error: training diverged at iteration '), last
    for part in ('not finite: ', 'loss=', 'learning rate lr=1000', 'divergence_guard = False'):
        assert part in last, last
    # every checkpoint written holds finite weights, and the message names the last one
    ckpts = _checkpoints(tmp_path / 'wd')
    assert all(not _non_finite(p) for p in ckpts)
    if ckpts:
        assert f'the last checkpoint written is {ckpts[-1]}' in last, last
    else:
        assert 'no checkpoint has been written yet' in last


def test_guard_off_trains_on_and_test_tool_warns(synthetic_data_root, tmp_path):
    config = _config(
        tmp_path, synthetic_data_root, epochs=4, extra=_DIVERGING + 'divergence_guard = False\n')
    proc = _run('train.py', [config, '--work-dir', 'wd'], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = osp.join(str(tmp_path / 'wd'), 'epoch_4.pth')
    assert _non_finite(last)  # the switch really let it train on through NaN
    test = _run('test.py', [config, last, '--work-dir', 'test_wd'], tmp_path)
    out = test.stdout + test.stderr
    assert f'checkpoint {last} holds weights that are not finite' in out, out[-3000:]


def test_pola_op_error_in_training_names_the_layer(synthetic_data_root, tmp_path):
    """Weights that are not finite in one Pola attention layer: the op's error, raised in
    training, becomes the divergence error naming that layer."""
    config = _config(tmp_path, synthetic_data_root, epochs=1)
    work_dir = str(tmp_path / 'wd')
    state = entry.build_runner(
        entry.prepare_train_config(entry.load_config(config), config,
                                   work_dir=work_dir)).model.state_dict()
    # the learned feature scale of the second stage's first Pola attention layer
    layer = [k for k in state if k.startswith('backbone.') and k.endswith('.scale')][1]
    state[layer] = torch.full_like(state[layer], float('nan'))
    poisoned = str(tmp_path / 'poisoned.pth')
    torch.save({'state_dict': state, 'meta': {}}, poisoned)
    cfg = entry.load_config(config, {'load_from': poisoned})
    runner = entry.build_runner(entry.prepare_train_config(cfg, config, work_dir=work_dir))
    with pytest.raises(TrainingDivergedError) as info:
        runner.train()
    message = str(info.value)
    module = layer.rsplit('.', 1)[0]
    assert 'training diverged at iteration 1 (epoch 1)' in message
    assert f'Pola attention layer {module}' in message and 'are not finite' in message
    assert not _checkpoints(tmp_path / 'wd')


def test_message_with_many_parameter_groups_is_short(synthetic_data_root, tmp_path):
    """A parameter group per parameter (any paramwise_cfg, as Mask2Former's configs set):
    the message gives the smallest and largest learning rate and the number of groups,
    not every group's."""
    extra = _DIVERGING + ('optim_wrapper.update(paramwise_cfg=dict('
                          "custom_keys={'backbone': dict(lr_mult=0.1)}))\n")
    config = _config(tmp_path, synthetic_data_root, epochs=6, extra=extra)
    proc = _run('train.py', [config, '--work-dir', 'wd'], tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('train.py: error: training diverged at iteration '), last
    assert ' lr from 100 to 1000 (' in last and 'parameter groups)' in last, last
    assert len(last) < 1200, len(last)


def test_summarise_lrs_and_zero_loss_scale():
    """The learning-rate summary; a dynamic loss scale of 0 is named as such (with CUDA:
    mmengine's AmpOptimWrapper with its real GradScaler), never as 'not finite'."""
    from polaformer_mm.engine.divergence import loss_scales, summarise_lrs
    assert summarise_lrs({'lr': [0.1]}) == 'lr=0.1'
    assert summarise_lrs({'lr': [0.1] * 3}) == 'lr=0.1 (3 parameter groups)'
    assert summarise_lrs({'lr': [0.1, 0.01, 0.1]}) == 'lr from 0.01 to 0.1 (3 parameter groups)'
    from mmengine.optim import OptimWrapper
    model = torch.nn.Linear(2, 2)
    plain = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    assert loss_scales(plain) == []
    if not torch.cuda.is_available():
        return
    from mmengine.optim import AmpOptimWrapper
    amp = AmpOptimWrapper(
        optimizer=torch.optim.SGD(model.cuda().parameters(), lr=0.1), loss_scale=0.0)
    assert loss_scales(amp) == [0.0]
