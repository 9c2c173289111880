"""Runner checkpoints under torch's weights-only loading (runner state encoding), and the
random states of a validation that fails."""
import io
import os
import pickle
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.logging import HistoryBuffer
from mmengine.registry import HOOKS

from polaformer_mm.engine import restore_runner_state, to_weights_only_safe
from polaformer_mm.utils.checkpoint_io import safe_load_scope


def _message_hub_state():
    buf = HistoryBuffer([0.5, 0.25, 0.125], [1, 1, 2], max_length=10)
    return OrderedDict(
        log_scalars=OrderedDict({'train/loss': buf}),
        runtime_info=OrderedDict(
            eta=np.float64(1.5),
            iter=np.int64(3),
            seed=7,
            arr=np.arange(3),
            dataset_meta=dict(classes=('a', 'b'))),
        resumed_keys=OrderedDict(eta=False))


def _save(obj):
    f = io.BytesIO()
    torch.save(obj, f)
    f.seek(0)
    return f


def test_plain_mmengine_state_is_refused_without_allowlist():
    with pytest.raises(pickle.UnpicklingError):
        torch.load(_save({'message_hub': _message_hub_state()}), weights_only=True)


def test_safe_encoding_loads_weights_only_and_restores_buffers():
    ckpt = {'message_hub': to_weights_only_safe(_message_hub_state())}
    loaded = torch.load(_save(ckpt), weights_only=True)  # no allowlist at all
    hub = restore_runner_state(loaded['message_hub'])
    buf = hub['log_scalars']['train/loss']
    assert isinstance(buf, HistoryBuffer)
    np.testing.assert_allclose(buf.data[0], [0.5, 0.25, 0.125])
    np.testing.assert_array_equal(buf.data[1], [1, 1, 2])
    assert buf.max_length == 10
    assert hub['runtime_info']['eta'] == 1.5 and isinstance(hub['runtime_info']['eta'], float)
    assert hub['runtime_info']['iter'] == 3
    assert torch.equal(hub['runtime_info']['arr'], torch.arange(3))
    assert hub['runtime_info']['dataset_meta'] == dict(classes=('a', 'b'))


def test_plain_mmengine_checkpoint_loads_with_allowlist():
    f = _save({'message_hub': _message_hub_state(), 'meta': {'eta': np.float32(2.0)}})
    with safe_load_scope():
        loaded = torch.load(f, weights_only=True)
    hub = restore_runner_state(loaded['message_hub'])
    buf = hub['log_scalars']['train/loss']
    assert isinstance(buf, HistoryBuffer)
    assert buf.mean() == pytest.approx((0.5 + 0.25 + 0.125) / 4)  # count-weighted


class _Exploit:

    def __reduce__(self):
        return (os.system, ('echo should-not-run', ))


def test_allowlist_still_refuses_code():
    f = _save({'state_dict': {}, 'meta': _Exploit()})
    with safe_load_scope(), pytest.raises(pickle.UnpicklingError, match='system'):
        torch.load(f, weights_only=True)


def test_allowlist_is_scoped():
    f = _save({'x': np.float64(1.0)})
    with safe_load_scope():
        torch.load(f, weights_only=True)
    f.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(f, weights_only=True)


def test_multistep_scheduler_state_loads_weights_only_and_resumes_the_same():
    """A multi-step schedule keeps its milestones in a collections.Counter, which torch <
    2.6's weights-only loading refuses: saved as a plain dict, restored as a Counter, the
    restored scheduler gives the same learning rates."""
    from collections import Counter

    from mmengine.optim import MultiStepLR

    from polaformer_mm.engine.runner_state import restore_scheduler_state

    def make():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
        return opt, MultiStepLR(opt, milestones=[2, 4], gamma=0.1, by_epoch=False)

    opt, sched = make()
    for _ in range(3):
        opt.step()
        sched.step()
    saved = to_weights_only_safe([sched.state_dict()])
    assert type(saved[0]['milestones']) is dict
    f = _save({'param_schedulers': saved})
    loaded = torch.load(f, weights_only=True)['param_schedulers']
    restored = restore_scheduler_state(loaded)
    assert type(restored[0]['milestones']) is Counter
    opt2, sched2 = make()
    opt2.load_state_dict(opt.state_dict())  # a resume restores both
    sched2.load_state_dict(restored[0])
    lrs = []
    for o, s in ((opt, sched), (opt2, sched2)):
        run = []
        for _ in range(3):
            o.step()
            s.step()
            run.append(o.param_groups[0]['lr'])
        lrs.append(run)
    assert lrs[0] == lrs[1] and lrs[0][0] == pytest.approx(0.001)
    # one list per optimizer (several optimizers) is restored too
    assert type(restore_scheduler_state({'a': saved})['a'][0]['milestones']) is Counter


@HOOKS.register_module(force=True)
class _DrawsAndFailsInValidation(Hook):
    """Runs after ResumableStateHook's before_val: records the random state it saved, draws
    from torch's generator as a validation does, then fails the validation."""
    priority = 'LOWEST'
    saved = []

    def before_val(self, runner):
        """Record the state validation started from."""
        self.saved.append(torch.get_rng_state())

    def before_val_iter(self, runner, batch_idx, data_batch=None):
        """Draw, then fail."""
        torch.rand(100)
        raise RuntimeError('a validation that fails')


def test_a_failed_validation_gives_back_the_random_states_it_saved(synthetic_data_root, tmp_path):
    """PolaRunner.val() raising: the random states from before it are put back and the
    saved states dropped (a later checkpoint of the runner would record them otherwise)."""
    from polaformer_mm.engine import entry
    from polaformer_mm.engine.hooks import ResumableStateHook
    from tests import REPO
    config = os.path.join(REPO, 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py')
    cfg = entry.load_config(config)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = synthetic_data_root
    cfg.custom_hooks = [dict(type='_DrawsAndFailsInValidation')]
    entry.prepare_train_config(cfg, config, work_dir=str(tmp_path))
    runner = entry.build_runner(cfg)
    _DrawsAndFailsInValidation.saved.clear()
    with pytest.raises(RuntimeError, match='a validation that fails'):
        runner.val()
    state_hook = next(h for h in runner.hooks if isinstance(h, ResumableStateHook))
    assert state_hook._before_val == []
    assert torch.equal(torch.get_rng_state(), _DrawsAndFailsInValidation.saved[0])
