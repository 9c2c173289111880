"""polaformer_mm.utils.checkpoint_io: the one reading path, its messages, atomic writes."""
import os
import os.path as osp
import pickle
import subprocess
import sys
import time
import traceback

import pytest
import torch

from polaformer_mm.utils.checkpoint_io import (CheckpointError, atomic_save, load_checkpoint,
                                               process_alive, require_checkpoint, safe_load_scope)

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


class _Exploit:

    def __reduce__(self):
        return (os.system, ('echo should-not-run', ))


def _good(path):
    torch.save({'state_dict': {'w': torch.arange(1000.)}, 'meta': {'epoch': 1}}, path)
    return path


def _shown(err):
    return ''.join(traceback.format_exception(err))


@pytest.mark.parametrize('name,make,expected', [
    ('empty.pth', lambda p: p.write_bytes(b''), 'is an empty file (0 bytes), not a checkpoint'),
    ('random.pth', lambda p: p.write_bytes(bytes(range(1, 256)) * 40), 'is not a checkpoint'),
    ('notes.txt', lambda p: p.write_text('hello\n' * 50), "starting with b'hello\\nhe'"),
    ('cut.pth', lambda p: p.write_bytes(_good(p).read_bytes()[:3000]),
     'is not a complete checkpoint'),
    ('evil.pth', lambda p: torch.save({'meta': _Exploit()}, p),
     'holds objects that weights-only loading refuses (posix.system)'),
])
def test_bad_files_are_named_without_the_unsafe_hint(tmp_path, name, make, expected):
    path = tmp_path / name
    make(path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(str(path), what='--resume checkpoint')
    message = str(info.value)
    assert message.startswith(f"--resume checkpoint '{path}'"), message
    assert expected in message, message
    # neither our message nor anything printed with it points at weights_only=False
    assert 'weights_only' not in _shown(info.value)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="load_from checkpoint not found: '.*nope.pth'"):
        load_checkpoint(str(tmp_path / 'nope.pth'), what='load_from checkpoint')
    with pytest.raises(IsADirectoryError, match='is a directory'):
        require_checkpoint(str(tmp_path))
    assert require_checkpoint('https://example.invalid/x.pth') == 'https://example.invalid/x.pth'


def test_good_file_and_path_like(tmp_path):
    obj = load_checkpoint(_good(tmp_path / 'good.pth'))
    assert torch.equal(obj['state_dict']['w'], torch.arange(1000.))


def test_scope_forces_weights_only_and_is_left_as_found(tmp_path, monkeypatch):
    evil = tmp_path / 'evil.pth'
    torch.save({'x': _Exploit()}, evil)
    # a user who switched weights-only loading off for their own code
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    monkeypatch.delenv('TORCH_FORCE_WEIGHTS_ONLY_LOAD', raising=False)
    with safe_load_scope(), pytest.raises(pickle.UnpicklingError, match='system'):
        torch.load(evil, weights_only=False)
    assert os.environ['TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'] == '1'
    assert 'TORCH_FORCE_WEIGHTS_ONLY_LOAD' not in os.environ
    with pytest.raises(CheckpointError, match='refuses'):
        load_checkpoint(str(evil))
    assert os.environ['TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'] == '1'


def test_atomic_save_never_leaves_half_a_file(tmp_path):
    path = tmp_path / 'ckpt.pth'
    atomic_save({'w': torch.ones(3)}, path)
    assert torch.equal(torch.load(path, weights_only=True)['w'], torch.ones(3))
    before = path.read_bytes()
    with pytest.raises(Exception):  # a local function cannot be pickled: fails mid-write
        atomic_save({'w': torch.zeros(3), 'f': lambda: None}, path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pth']  # no temporary file left
    # a temporary file of an interrupted earlier write (its writer is dead) is removed by
    # the next write; one of a live writer and one whose name carries no pid stay
    dead = _dead_pid()
    (tmp_path / f'.ckpt.pth.tmp-{dead}-0badf00d').write_bytes(b'half')
    with subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']) as alive:
        try:
            kept = [f'.ckpt.pth.tmp-{alive.pid}-0badf00d', '.ckpt.pth.tmp-by-hand']
            for name in kept:
                (tmp_path / name).write_bytes(b'half')
            atomic_save({'w': torch.zeros(3)}, path)
        finally:
            alive.kill()
    assert sorted(os.listdir(tmp_path)) == sorted(['ckpt.pth'] + kept)
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~_umask())


def _dead_pid():
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'],
                          capture_output=True,
                          text=True,
                          check=True)
    pid = int(proc.stdout)
    assert not process_alive(pid)
    return pid


WRITER = """
import os, sys, time
import torch
from polaformer_mm.utils.checkpoint_io import atomic_write

path, marker, go = sys.argv[1:]


def write(tmp):
    torch.save({'w': torch.ones(3)}, tmp)
    open(marker, 'w').close()
    while not os.path.exists(go):  # another process writes the same file meanwhile
        time.sleep(0.05)


atomic_write(path, write)
"""


def test_a_write_in_progress_survives_another_writer(tmp_path):
    """Two processes write one checkpoint at once: the second does not delete the
    first one's temporary file (which then used to die with FileNotFoundError)."""
    path, marker, go = (str(tmp_path / n) for n in ('ckpt.pth', 'marker', 'go'))
    env = dict(os.environ, PYTHONPATH=REPO)
    with subprocess.Popen([sys.executable, '-c', WRITER, path, marker, go],
                          env=env,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True) as other:
        deadline = time.time() + 120
        while not os.path.exists(marker):
            assert other.poll() is None, other.stdout.read()
            assert time.time() < deadline
            time.sleep(0.05)
        atomic_save({'w': torch.zeros(3)}, path)
        open(go, 'w').close()
        out, _ = other.communicate(timeout=120)
    assert other.returncode == 0, out
    assert torch.equal(torch.load(path, weights_only=True)['w'], torch.ones(3))  # the later
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pth', 'go', 'marker']


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
