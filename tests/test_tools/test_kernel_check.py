"""tools/kernel_check.py (polaformer_mm.ops.pola_attention.selfcheck): ``--quick`` through
Triton's interpreter passes every check in a process where no OpenMMLab package can be
imported, without a GPU and without ``TRITON_INTERPRET=1`` it says what to run and exits 2,
and the comparison flags a real mismatch."""
import io
import json
import math
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from polaformer_mm.ops.pola_attention import selfcheck
from polaformer_mm.ops.pola_attention.triton_backend import TOLERANCES
from polaformer_mm.utils.compat import triton_interpreter_reason, triton_status
from .. import REPO

TOOL = osp.join(REPO, 'tools', 'kernel_check.py')
BLOCKED = ('mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'mmengine')

# Runs the tool as __main__ after a finder at the head of sys.meta_path refuses every
# OpenMMLab package, so the run proves that torch and Triton are all the tool needs.
BOOTSTRAP = '''
import runpy, sys
BLOCKED = {blocked!r}

class RefuseOpenMMLab:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ImportError(f'{{name}} is made unimportable for this check')
        return None

sys.meta_path.insert(0, RefuseOpenMMLab())
sys.argv = [{tool!r}] + sys.argv[1:]
runpy.run_path({tool!r}, run_name='__main__')
'''

needs_interpreter = pytest.mark.skipif(
    triton_interpreter_reason() is not None,
    reason=f'{triton_interpreter_reason()} (the quick check runs the kernels in the interpreter)')


def _env(interpret: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ('TRITON_INTERPRET', 'PYTHONPATH')}
    if interpret:
        env['TRITON_INTERPRET'] = '1'
    env.setdefault('OMP_NUM_THREADS', '1')
    return env


def _table_rows(stdout: str):
    """The table's rows as lists of cells (the header and the rule left out)."""
    rows = []
    for line in stdout.splitlines():
        if line.startswith('| ') and not line.startswith('| row ') and '| ---' not in line:
            rows.append([c.strip() for c in line.strip('|').split('|')])
    return rows


@pytest.mark.slow
@needs_interpreter
def test_quick_run_passes_with_torch_and_triton_alone(tmp_path):
    out = tmp_path / 'kernel_check.json'
    proc = subprocess.run(
        [
            sys.executable, '-c',
            BOOTSTRAP.format(blocked=BLOCKED, tool=TOOL), '--quick', '--json',
            str(out)
        ],
        cwd=str(tmp_path),  # not the repository: the tool finds the package itself
        env=_env(interpret=True),
        capture_output=True,
        text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _table_rows(proc.stdout)
    checks = [r for r in rows if r[0] == 'check']
    assert [r[1] for r in checks] == [c.name for c in selfcheck.QUICK_CASES], proc.stdout
    assert all(r[4] == 'PASS' for r in checks), proc.stdout
    assert [r[4] for r in rows if r[0] == 'kernels'] == ['PASS'], proc.stdout
    timings = [r for r in rows if r[0].startswith('time')]
    assert [(r[0], r[1]) for r in timings] == [(f'time {mode}', path) for mode in ('fwd', 'fwd+bwd')
                                               for path in ('torch', 'sdpa', 'triton')]
    assert all(r[4] == 'ok' and r[5].endswith(' ms') for r in timings), proc.stdout
    assert 'failed' not in proc.stdout.splitlines()[-2] or ' 0 failed' in proc.stdout
    result = json.loads(out.read_text())
    assert result['verdict'] == 'passed' and result['failed'] == 0, result
    assert result['environment']['triton_interpret'] is True
    for row in result['rows']:
        if row['row'] == 'check':
            assert all(err <= row['tol'] for err in row['rel_err'].values()), row


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='this machine has a GPU')
def test_without_a_gpu_it_says_what_to_run(tmp_path):
    proc = subprocess.run(
        [sys.executable, TOOL, '--json', str(tmp_path / 'r.json')],
        env=_env(interpret=False),
        capture_output=True,
        text=True,
        timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert 'kernel_check needs a CUDA GPU' in proc.stderr
    assert 'TRITON_INTERPRET=1 python tools/kernel_check.py --quick' in proc.stderr
    assert not (tmp_path / 'r.json').exists()


@pytest.mark.skipif(
    not triton_status().usable or triton_interpreter_reason() is None,
    reason='needs a supported Triton without an interpreter (Triton 2.x)')
def test_with_a_triton_without_interpreter_it_says_so():
    env = _env(interpret=False)  # this process's PYTHONPATH kept: the Triton it imported
    env.update({k: v for k, v in os.environ.items() if k == 'PYTHONPATH'})
    proc = subprocess.run([sys.executable, TOOL, '--quick', '--interpret', '--no-timing'],
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert 'has no interpreter' in proc.stderr and triton_status().version in proc.stderr


def test_relative_error_flags_a_real_mismatch():
    g = torch.Generator().manual_seed(0)
    expected = torch.randn(2, 3, 17, 32, generator=g)
    scale = float(expected.abs().max())
    off = expected.clone()
    off[1, 2, 5, 7] += 3 * TOLERANCES[torch.float32] * scale  # one entry off by 3 tolerances
    err = selfcheck.relative_error(off, expected)
    assert math.isclose(err, 3 * TOLERANCES[torch.float32], rel_tol=1e-3)
    assert not err <= TOLERANCES[torch.float32]
    assert selfcheck.relative_error(expected.half(), expected) <= TOLERANCES[torch.float16]
    nan = expected.clone()
    nan[0, 0, 0, 0] = float('nan')
    assert selfcheck.relative_error(nan, expected) == math.inf
    assert selfcheck.relative_error(expected[..., :16], expected) == math.inf
    assert selfcheck.relative_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert selfcheck.relative_error(torch.ones(3), torch.zeros(3)) == math.inf
    assert selfcheck.relative_error(torch.empty(0, 4), torch.empty(0, 4)) == 0.0


@pytest.mark.skipif(
    selfcheck.interpreting() or torch.cuda.is_available(),
    reason='the kernels can run here, so the call does not fail')
def test_a_failing_call_is_a_fail_row_with_its_error():
    case = selfcheck.QUICK_CASES[1]
    row = selfcheck.check_case(case, torch.device('cpu'))  # no CUDA tensors, no interpreter
    assert row.result == 'FAIL'
    assert 'backend="triton"' in row.details['error'], row.details
    result = selfcheck.summarize([row], {}, quick=True, elapsed_s=1.0)
    assert result['verdict'] == 'failed' and result['failed'] == 1


def test_inputs_of_every_case_kind():
    kinds = {c.kind for c in selfcheck.FULL_CASES + selfcheck.QUICK_CASES}
    assert kinds == {
        'plain', 'one_sign', 'large', 'meet_zero', 'zeros', 'growing', 'padded', 'strided',
        'subnormal'
    }
    for case in selfcheck.FULL_CASES:
        if case.N * case.n > 10**5:
            continue
        (q, k, v, power), eps, grad = selfcheck.make_inputs(case, torch.device('cpu'))
        assert q.shape == grad.shape == (case.B, case.h, case.N, case.d), case
        assert k.shape == v.shape == (case.B, case.h, case.n, case.d), case
        assert q.dtype == k.dtype == v.dtype == case.dtype and power.dtype == torch.float32
        if case.kind == 'strided':
            assert not q.is_contiguous() and q.stride(1) == case.d
        if case.kind == 'padded':
            assert eps.shape == (case.B, 1, 1, 1)
        if case.kind == 'subnormal':  # scattered: some in every channel, no channel all
            tiny = torch.finfo(torch.float32).tiny
            for x in (q, k):
                sub = (x != 0) & (x.abs() < tiny)
                per_channel = sub.reshape(-1, case.d).float().mean(0)
                assert 0 < float(per_channel.min()) and float(per_channel.max()) < 1, case
    bad = selfcheck.Case('x', 1, 1, 2, 2, 32, torch.float32, kind='nonsense')
    with pytest.raises(ValueError, match="unknown case kind 'nonsense'"):
        selfcheck.make_inputs(bad, torch.device('cpu'))


def test_rows_are_printed_as_they_come_and_sdpa_errors_fail_nothing():
    stream, saved = io.StringIO(), []
    table = selfcheck.Table(stream, on_row=lambda rows: saved.append(len(rows)))
    table.add(selfcheck.Row('check', 'a', 'float32', '1,1,2,2,32', 'PASS', '1.0e-07 (out)'))
    assert '| check ' in stream.getvalue() and saved == [1]
    table.add(selfcheck.Row('time fwd', 'sdpa', 'float16', '2,1,50176,50176,64', 'error'))
    table.add(selfcheck.Row('time fwd', 'triton', 'float16', '2,1,50176,50176,64', 'OOM'))
    result = selfcheck.summarize(table.rows, {}, quick=False, elapsed_s=2.0)
    assert saved == [1, 2, 3]
    assert (result['verdict'], result['failed'], result['oom']) == ('passed', 0, 1)
    table.add(selfcheck.Row('time fwd', 'triton', 'float16', '2,1,3136,3136,64', 'error'))
    assert selfcheck.summarize(table.rows, {}, quick=False, elapsed_s=2.0)['verdict'] == 'failed'
    assert len(stream.getvalue().splitlines()) == 2 + 4  # header, rule, four rows


def _kernel_check_tool():
    from .._tools import load_tool
    return load_tool('kernel_check.py', '_kernel_check_cli')


@pytest.mark.parametrize('where, message', [
    ('folder', 'is a folder, not a file'),
    ('under_a_file', '/file is a file, not a folder'),
    pytest.param(
        'proc',
        'cannot write in /proc',
        marks=pytest.mark.skipif(not osp.isdir('/proc'), reason='no /proc (not Linux)')),
])
def test_a_json_path_that_takes_no_file_is_refused_before_any_row(tmp_path, capsys, where, message):
    """A folder, a path under a file, and a folder that takes no file (``/proc``: root
    passes an access check there): a usage error (exit 2) naming --json and the path before
    any row runs; nothing is left behind (no ``.tmp``). A missing folder is made (the docs'
    work_dirs/kernel_check.json), so it is no error."""
    (tmp_path / 'file').write_text('x')
    path = {
        'folder': str(tmp_path),
        'under_a_file': str(tmp_path / 'file' / 'r.json'),
        'proc': '/proc/kernel_check.json'
    }[where]
    with pytest.raises(SystemExit) as info:
        _kernel_check_tool().main(['--quick', '--json', path])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f'--json {path}: ' in err and message in err, err
    assert '| check' not in err
    assert [p.name for p in tmp_path.iterdir()] == ['file']


@pytest.mark.parametrize('value', ['nan', 'inf', '0', '-5'])
def test_a_budget_that_is_no_positive_number_of_seconds_is_refused(value, capsys):
    with pytest.raises(SystemExit) as info:
        _kernel_check_tool().parse_args(['--budget-s', value])
    assert info.value.code == 2
    assert f'--budget-s must be a number of seconds > 0, got {float(value)}' in \
        capsys.readouterr().err


def test_a_json_write_that_fails_leaves_no_temporary_file(tmp_path):
    """The file is replaced through ``PATH.tmp``; when the replace fails (here ``PATH`` is
    a folder that holds a file) the temporary file is removed and the error raised."""
    target = tmp_path / 'r.json'
    target.mkdir()
    (target / 'keep').write_text('x')
    with pytest.raises(OSError):
        selfcheck.write_json({'rows': []}, str(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == ['r.json']


@pytest.mark.slow
def test_an_op_that_does_not_import_exits_2_naming_why(tmp_path):
    """POLA_ATTENTION_BACKEND=cuda stops the op's import (a ValueError naming the variable):
    exit status 2, as the docs say for an op that does not import, with that message."""
    env = dict(_env(interpret=True), POLA_ATTENTION_BACKEND='cuda')
    proc = subprocess.run([sys.executable, TOOL, '--quick', '--json',
                           str(tmp_path / 'r.json')],
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "kernel_check: the attention op does not import: POLA_ATTENTION_BACKEND='cuda'" in \
        proc.stderr
    assert 'Traceback' not in proc.stderr and list(tmp_path.iterdir()) == []
