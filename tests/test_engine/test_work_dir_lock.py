"""One live run per work dir: a second tools/train.py on it stops at once, naming the first;
the lock of a killed run is stale and ``--resume`` takes it over."""
import glob
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

from polaformer_mm.engine.work_dir_lock import LOCK_FILE, WorkDirLockedError, lock_work_dir
from tests import REPO
from .._smoke import two_epoch_det_config

pytestmark = pytest.mark.slow

PAUSE_HOOK = '''
"""Holds a training after the checkpoint of its first epoch until $POLA_GO exists."""
import os
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class PauseAfterFirstEpochHook(Hook):
    priority = 'LOWEST'  # after the CheckpointHook

    def after_train_epoch(self, runner):
        marker = os.environ.get('POLA_PAUSED')
        if marker and runner.epoch == 0:
            open(marker, 'w').close()
            while not os.path.exists(os.environ['POLA_GO']):
                time.sleep(0.1)
'''


def _env(tmp_path, **extra):
    return dict(
        os.environ, OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]), **extra)


def _train(cfg, work_dir, tmp_path, *extra, env=None, wait=True):
    cmd = [sys.executable, osp.join(REPO, 'tools/train.py'), str(cfg), '--work-dir', work_dir]
    proc = subprocess.Popen(
        cmd + list(extra),
        cwd=str(tmp_path),
        env=env or _env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def test_second_run_is_refused_and_a_killed_runs_lock_is_stale(synthetic_data_root, tmp_path):
    (tmp_path / 'pause_hook.py').write_text(PAUSE_HOOK)
    cfg = tmp_path / 'det.py'
    cfg.write_text(
        two_epoch_det_config(
            synthetic_data_root,
            'pause_hook',
            extra="custom_hooks = [dict(type='PauseAfterFirstEpochHook')]\n"))
    work_dir = tmp_path / 'wd'
    paused, go = tmp_path / 'paused', tmp_path / 'go'

    first = _train(
        cfg,
        'wd',
        tmp_path,
        env=_env(tmp_path, POLA_PAUSED=str(paused), POLA_GO=str(go)),
        wait=False)
    try:
        deadline = time.time() + 600
        while not paused.exists():
            assert first.poll() is None, first.communicate()[1][-4000:]
            assert time.time() < deadline, 'the first run never finished its first epoch'
            time.sleep(0.2)
        assert (work_dir / LOCK_FILE).is_file()
        runs_before = sorted(glob.glob(str(work_dir / '2*')))  # timestamp folders

        # a second training on the same work dir, while the first one lives
        code, out, err = _train(cfg, str(work_dir), tmp_path)
        assert code == 1, out[-2000:] + err[-2000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith('train.py: error: work dir ') and 'in use by another run' in last
        assert f'pid {first.pid} on host ' in last and 'started 20' in last
        assert 'tools/train.py' in last and str(cfg) in last  # the other run's command
        assert 'Traceback' not in err
        assert sorted(glob.glob(str(work_dir / '2*'))) == runs_before  # it wrote nothing
        assert 'Epoch(train)' not in out + err

        # the first run dies without releasing its lock: the file stays, stale
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert (work_dir / LOCK_FILE).is_file()
    assert not (work_dir / 'epoch_2.pth').exists()

    code, out, err = _train(cfg, str(work_dir), tmp_path, '--resume')
    assert code == 0, err[-4000:]
    log = out + err
    assert 'took over the lock file of a run that ended without releasing it ' \
           f'(pid {first.pid} on host ' in log
    assert 'Epoch(train) [2][1/1]' in log
    state = torch.load(work_dir / 'epoch_2.pth', map_location='cpu', weights_only=True)
    assert state['meta']['epoch'] == 2
    assert not (work_dir / LOCK_FILE).exists()  # released at the end of the run


HOLDER = '''
import sys, time
from polaformer_mm.engine.work_dir_lock import lock_work_dir
lock = lock_work_dir(sys.argv[1], command='holder --of the lock')
print('locked', flush=True)
time.sleep(120)
'''


def test_lock_names_its_holder_is_shared_in_process_and_taken_over_when_stale(tmp_path):
    work_dir = str(tmp_path / 'wd')
    holder = subprocess.Popen([sys.executable, '-c', HOLDER, work_dir],
                              env=_env(tmp_path),
                              stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == 'locked'
        with pytest.raises(WorkDirLockedError) as info:
            lock_work_dir(work_dir)
        message = str(info.value)
        assert '\n' not in message
        assert f'pid {holder.pid} on host ' in message and 'holder --of the lock' in message
        assert osp.join(osp.realpath(work_dir), LOCK_FILE) in message
    finally:
        holder.kill()
        holder.communicate()

    first = lock_work_dir(work_dir)  # the holder died: its lock is stale
    assert first.locked and first.previous['pid'] == holder.pid
    second = lock_work_dir(work_dir)  # another runner of this process shares it
    assert second.previous is None
    path = first.path
    first.release()
    assert osp.exists(path)  # still held by the second
    second.release()
    assert not osp.exists(osp.join(work_dir, LOCK_FILE))
    third = lock_work_dir(work_dir)  # released cleanly: nothing to take over
    assert third.previous is None
    third.release()
