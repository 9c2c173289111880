"""polaformer_mm.utils.checkpoint_io: the one reading path, its messages, atomic writes."""
import os
import pickle
import subprocess
import sys
import time
import traceback

import pytest
import torch

from polaformer_mm.utils.checkpoint_io import (CheckpointError, atomic_save, load_checkpoint,
                                               process_alive, require_checkpoint, safe_load_scope)
from tests import REPO


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


@pytest.mark.slow
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


class _Touch:
    """A payload that would create a file if it ever ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f'touch {self.path}', ))


def _numpy_and_runner_state(path):
    from collections import OrderedDict

    import numpy as np
    obj = {
        'state_dict': OrderedDict(w=torch.randn(3, 4), b=torch.nn.Parameter(torch.ones(2))),
        'meta': {
            'epoch': 3,
            'iter': np.int64(12),
            'lr': np.float32(0.5),
            'hist': np.arange(5, dtype=np.float64),
            'shape': torch.Size([2, 3]),
            'dtype': torch.float16,
            'tags': {'a', 'b'},
            'raw': b'\x00\x01'
        },
        'half': torch.zeros(2, dtype=torch.bfloat16),
        'view': torch.arange(10.)[2:7],
    }
    torch.save(obj, path)
    return obj


def _assert_same(a, b):
    import numpy as np
    if isinstance(a, torch.Tensor):
        assert type(a) is type(b) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b and type(a) is type(b), (a, b)


def test_restricted_unpickler_reads_what_checkpoints_hold(tmp_path):
    """The restricted reader (what torch 2.1-2.5 read with) and the scope on this torch
    give back the same objects: tensors and parameters, views, numpy arrays and scalars,
    sizes, dtypes, sets and bytes."""
    from polaformer_mm.utils.checkpoint_io import restricted_load
    path = tmp_path / 'mixed.pth'
    want = _numpy_and_runner_state(path)
    _assert_same(want, restricted_load(str(path)))
    _assert_same(want, load_checkpoint(str(path)))


@pytest.mark.parametrize('legacy', [False, True])
def test_payloads_are_refused_and_never_run(tmp_path, legacy):
    """The os.system payload is refused before it is called, by the restricted reader
    and by load_checkpoint on this torch, in the zip and the legacy format."""
    from polaformer_mm.utils.checkpoint_io import restricted_load
    marker = tmp_path / 'ran'
    path = tmp_path / 'evil.pth'
    torch.save({
        'w': torch.ones(2),
        'x': _Touch(marker)
    },
               path,
               _use_new_zipfile_serialization=not legacy)
    with pytest.raises(pickle.UnpicklingError, match=r'GLOBAL posix\.system'):
        restricted_load(str(path))
    with pytest.raises(CheckpointError, match=r'refuses \(posix\.system\)'):
        load_checkpoint(str(path))
    # and inside the scope a caller's own weights_only=False changes nothing
    with safe_load_scope(), pytest.raises(pickle.UnpicklingError, match='system'):
        torch.load(path, weights_only=False)
    assert not marker.exists()


def test_the_scope_leaves_torch_load_as_it_found_it(tmp_path):
    original = torch.load
    with safe_load_scope():
        with safe_load_scope():
            pass
        torch.load(_good(tmp_path / 'g.pth'))
    assert torch.load is original


def _rewrite_member(path, old, new):
    """Replace bytes inside the pickle of a torch.save zip, keeping the archive intact."""
    import zipfile
    with zipfile.ZipFile(path) as src:
        members = [(info, src.read(info)) for info in src.infolist()]
    with zipfile.ZipFile(path, 'w', compression=zipfile.ZIP_STORED) as dst:
        for info, data in members:
            if info.filename.endswith('/data.pkl'):
                assert old in data
                data = data.replace(old, new)
            dst.writestr(info.filename, data)


def test_an_intact_file_this_torch_cannot_read_is_not_called_damaged(tmp_path):
    """A dtype this torch does not have (as in a file from a newer torch): the message
    says the file is intact and this torch cannot read it, not that it is damaged."""
    path = tmp_path / 'newer.pth'
    torch.save({'w': torch.ones(2), 'dtype': torch.float32}, path)
    _rewrite_member(path, b'float32', b'float99')
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(str(path))
    message = str(info.value)
    assert 'intact checkpoint that this torch' in message and 'torch.float99' in message
    assert 'complete' not in message and 'damaged' not in message
    assert 'weights_only' not in _shown(info.value)


def test_a_damaged_member_is_called_damaged(tmp_path):
    path = tmp_path / 'flipped.pth'
    _good(path)
    data = bytearray(path.read_bytes())
    at = data.index(b'data.pkl') + 200  # inside the pickle's bytes
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match='not a .*checkpoint|damaged') as info:
        load_checkpoint(str(path))
    assert 'intact' not in str(info.value)
