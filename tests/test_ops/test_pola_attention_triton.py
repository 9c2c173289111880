"""The fused Triton kernels against the torch path, on the CPU through Triton's interpreter.

``TRITON_INTERPRET=1`` only takes effect if it is set before Triton is imported, so the
kernels run in a fresh process (tests/test_ops/_triton_worker.py) whatever this process
imported before; one process runs all cases and these tests check its numbers.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from polaformer_mm.ops.pola_attention.triton_backend import TOLERANCES
from polaformer_mm.utils.compat import triton_interpreter_reason, triton_status
from ._triton_worker import CASES

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

pytestmark = pytest.mark.skipif(
    not triton_status().usable,
    reason=f'{triton_status().reason} (pip install polaformer_mm[triton], or '
    '-r requirements/tests.txt)')

#: The interpreter's tests run on Triton 3.0+ (2.x has no interpreter).
needs_interpreter = pytest.mark.skipif(
    triton_interpreter_reason() is not None, reason=str(triton_interpreter_reason()))


def _worker(mode: str, interpret: bool):
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    if interpret:
        env['TRITON_INTERPRET'] = '1'
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, env.get('PYTHONPATH')]))
    env.setdefault('OMP_NUM_THREADS', '1')
    proc = subprocess.run([sys.executable, '-m', 'tests.test_ops._triton_worker', mode],
                          cwd=REPO,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def interpreted():
    return _worker('interpret', interpret=True)


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize('case', sorted(CASES))
def test_kernels_match_the_torch_path(interpreted, case):
    result = interpreted[case]
    dtype = CASES[case][5]
    tol = TOLERANCES[getattr(torch, dtype)]  # about one rounding of the storage dtype
    assert result['dtype'] == f'torch.{dtype}'
    for name in ('out', 'q', 'k', 'v', 'power'):
        assert result[name]['finite'], (case, name)
        assert result[name]['rel_err'] < tol, (case, name, result[name])
    if case == 'strided_layout':
        assert result['out_stride'] == result['q_stride']
    if case == 'tensor_eps_padded_keys':
        assert result['real_keys_rel_err'] < TOLERANCES[torch.float32], result
    if case == 'largest_alpha_one_sign_keys':  # the torch path's exact scheme takes over
        assert result['shared_shifts_lose_rows'], result
        assert result['exact_abs_err'] < 1e-4, result
    if case == 'no_queries':  # an empty output; the keys, values and power get 0
        assert result['out']['shape'] == [2, 2, 0, 32], result
        assert all(result[name]['max_abs'] == 0 for name in ('q', 'k', 'v', 'power')), result


@pytest.mark.slow
@pytest.mark.skipif(
    triton_interpreter_reason() is not None,
    reason='lowers through Triton 3.x compiler stages (the compile report compiles every '
    'kernel through Triton 2.x)')
def test_kernels_lower_for_a_gpu():
    """Triton's compiler needs no GPU: every kernel goes through it for sm_90 up to the
    GPU dialect (what the interpreter does not check: typing, tl.dot shapes, layouts),
    for head widths 32, 7 and 64, and at 64 in every launch configuration."""
    from polaformer_mm.ops.pola_attention.triton_kernels import CONFIGS, KERNELS
    lowered = _worker('compile', interpret=False)
    assert len(lowered) == sum(len(CONFIGS[name]) + 2 for name in KERNELS), lowered


@pytest.mark.slow
@needs_interpreter
def test_a_failing_first_launch_takes_the_torch_path_for_that_case():
    """A kernel that raises at its first launch (as a GPU's compiler or an out-of-resources
    launch would): backend='auto' warns once, naming the reason, computes the call with the
    torch path and keeps that case there; the other cases keep the kernels; a forced
    'triton' names the earlier failure."""
    result = _worker('fallback', interpret=True)
    calls = result['calls']
    for d, stage in (('d32', 'forward'), ('d16', 'backward')):
        case = result[d]
        assert len(case['warnings']) == 1, case['warnings']
        warning = case['warnings'][0]
        assert f'first {stage} launch' in warning and 'OutOfResources' in warning, warning
        assert 'POLA_ATTENTION_BACKEND=torch' in warning
        # both calls (the failing one, and the next, on the torch path) give the op's result
        assert max(case['rel_err']) < 1e-5, case['rel_err']
        assert 'failed at their first launch' in case['forced'], case['forced']
    # each failing kernel was launched once only: the case then stayed on the torch path
    assert calls['forward_raised'] == 1 and calls['backward_raised'] == 1, calls
    # the width-16 case ran its forward kernels twice (its backward failed, not its forward)
    assert calls['forward'] == 1 + 1, calls
