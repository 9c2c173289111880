"""A run killed while it writes a checkpoint resumes from the previous one.

tools/train.py trains the quickstart Mask R-CNN config (``max_keep_ckpts=1``) for two
epochs in a subprocess. A module imported through the config's ``custom_imports`` slows
the write of the second checkpoint down: mmengine's local file backend writes half of the
bytes, flushes them, signals, and waits. The test kills the process (SIGKILL) there, then
resumes with ``--resume``.
"""
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests import REPO
from .._smoke import two_epoch_det_config

SLOW_WRITE = '''
"""Fault injection: the write of a checkpoint named $POLA_SLOW_CKPT stops half-way."""
import os
import time

from mmengine.fileio.backends.local_backend import LocalBackend

_put = LocalBackend.put


def _slow_put(self, obj, filepath):
    name = os.environ.get('POLA_SLOW_CKPT')
    if name and name in os.path.basename(str(filepath)):
        with open(filepath, 'wb') as f:
            f.write(obj[:len(obj) // 2])
            f.flush()
            os.fsync(f.fileno())
        open(os.environ['POLA_SLOW_MARKER'], 'w').close()
        time.sleep(600)
    return _put(self, obj, filepath)


LocalBackend.put = _slow_put
'''


def _train(cfg, work_dir, tmp_path, extra=(), slow=None, wait_for=None):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    if slow:
        env.update(POLA_SLOW_CKPT=slow, POLA_SLOW_MARKER=str(tmp_path / 'marker'))
    cmd = [
        sys.executable,
        osp.join(REPO, 'tools/train.py'),
        str(cfg), '--work-dir',
        str(work_dir), *extra
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=str(tmp_path),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True)
    if wait_for is None:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-4000:]
        return out
    deadline = time.time() + 600
    while not osp.exists(wait_for):
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.time() < deadline, 'the slowed write never started'
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # half of epoch_2's bytes are on disk now
    proc.communicate(timeout=60)
    return None


def _loads(path):
    return torch.load(path, map_location='cpu', weights_only=True)  # no allowlist


@pytest.mark.slow
def test_kill_during_checkpoint_write_then_resume(synthetic_data_root, tmp_path):
    (tmp_path / 'slow_ckpt_write.py').write_text(SLOW_WRITE)
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(
        two_epoch_det_config(synthetic_data_root, 'slow_ckpt_write',
                             'dict(interval=1, max_keep_ckpts=1)'))
    work_dir = tmp_path / 'wd'

    _train(cfg, work_dir, tmp_path, slow='epoch_2.pth', wait_for=tmp_path / 'marker')
    # the previous checkpoint is still there, complete, and named by last_checkpoint;
    # the half-written one never got the name epoch_2.pth
    last = (work_dir / 'last_checkpoint').read_text().strip()
    assert osp.basename(last) == 'epoch_1.pth', last
    assert _loads(last)['meta']['epoch'] == 1
    assert not (work_dir / 'epoch_2.pth').exists()
    leftovers = [n for n in os.listdir(work_dir) if '.tmp-' in n]
    assert len(leftovers) == 1, os.listdir(work_dir)  # the half file, under a temporary name

    out = _train(cfg, work_dir, tmp_path, extra=['--resume'])
    assert 'resumed epoch: 1, iter: 1' in out, out[-3000:]
    assert 'Epoch(train) [2][1/1]' in out
    assert _loads(work_dir / 'epoch_2.pth')['meta']['epoch'] == 2
    names = sorted(n for n in os.listdir(work_dir) if n.endswith('.pth') or '.tmp-' in n)
    assert names == ['epoch_2.pth'], names  # max_keep_ckpts=1; the half file is cleaned up
    assert (work_dir / 'last_checkpoint').read_text().strip().endswith('epoch_2.pth')


def test_best_checkpoint_is_replaced_only_after_the_new_one_is_written(
        synthetic_data_root, tmp_path, monkeypatch):
    """mmengine deletes the previous best checkpoint before it writes the new one; a write
    that fails then leaves no best checkpoint at all."""
    from mmengine.fileio.backends.local_backend import LocalBackend

    from polaformer_mm.engine import PolaCheckpointHook, entry
    from .._smoke import smoke_config
    seg = osp.join(REPO, 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py')
    cfg = smoke_config(entry.load_config(seg), synthetic_data_root, tmp_path / 'wd')
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook',
        interval=1,
        by_epoch=False,
        max_keep_ckpts=1,
        save_best='mIoU',
        rule='greater')
    runner = entry.build_runner(cfg)
    hook = next(h for h in runner.hooks if isinstance(h, PolaCheckpointHook))
    hook.before_train(runner)
    wd = tmp_path / 'wd'

    runner.train_loop._iter = 1
    hook._save_best_checkpoint(runner, {'mIoU': 10.0})
    assert (wd / 'best_mIoU_iter_1.pth').is_file()

    put = LocalBackend.put

    def failing_put(self, obj, filepath):
        if 'best_mIoU_iter_2' in str(filepath):
            raise OSError('disk full')
        return put(self, obj, filepath)

    monkeypatch.setattr(LocalBackend, 'put', failing_put)
    runner.train_loop._iter = 2
    with pytest.raises(OSError, match='disk full'):
        hook._save_best_checkpoint(runner, {'mIoU': 20.0})
    monkeypatch.setattr(LocalBackend, 'put', put)
    assert _loads(wd / 'best_mIoU_iter_1.pth')['meta']['iter'] == 1  # still there
    assert not [n for n in os.listdir(wd) if 'iter_2' in n]  # no half file either

    runner.train_loop._iter = 3
    hook._save_best_checkpoint(runner, {'mIoU': 30.0})
    assert (wd / 'best_mIoU_iter_3.pth').is_file()
    assert not (wd / 'best_mIoU_iter_2.pth').exists()
