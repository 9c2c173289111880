"""tools/analysis_tools/benchmark_pola_attention.py: a device or backend the machine cannot
run is a usage error naming it before any measurement (it was a traceback), and a run on the
CPU measures."""
import pytest
import torch

from polaformer_mm.ops.pola_attention import triton_backend
from .._tools import load_tool


@pytest.fixture(scope='module')
def tool():
    return load_tool('analysis_tools/benchmark_pola_attention.py', '_benchmark_pola_attention')


@pytest.mark.skipif(torch.cuda.is_available(), reason='this machine has a GPU')
def test_cuda_without_a_gpu_is_named(tool, capsys):
    with pytest.raises(SystemExit) as info:
        tool.parse_args(['--device', 'cuda'])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert '--device cuda: torch' in err and 'sees no CUDA GPU; run with --device cpu' in err


@pytest.mark.skipif(
    torch.cuda.is_available() or triton_backend.interpreting(),
    reason='the kernels can take CPU tensors or there is a GPU')
def test_triton_on_cpu_tensors_is_named_with_the_ops_reason(tool, capsys):
    """``--backend triton`` takes the reasons of the op's own check; ``--backend torch``
    is the way out the message names, and it runs."""
    with pytest.raises(SystemExit) as info:
        tool.parse_args(['--device', 'cpu', '--backend', 'triton', '--shapes', '0'])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert '--backend triton on cpu (float32, head width 64): ' in err, err
    assert 'the kernels need CUDA tensors (got cpu)' in err and 'run with --backend torch' in err
    assert tool.parse_args(['--device', 'cpu', '--backend', 'torch', '--shapes', '0']).shapes == [0]


def test_a_device_torch_does_not_know_is_named(tool, capsys):
    with pytest.raises(SystemExit) as info:
        tool.parse_args(['--device', 'gpu'])
    assert info.value.code == 2
    assert '--device gpu: ' in capsys.readouterr().err


def test_a_cpu_run_measures_every_implementation(tool, capsys):
    tool.main(
        ['--device', 'cpu', '--backend', 'torch', '--shapes', '0', '--repeat', '1', '--no-memory'])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith('PVT-T stage1 224')]
    assert [r.split()[8] for r in rows[:3]] == ['op', 'naive', 'explicit'], out
    assert rows[3].split()[-2] != 'nan', out  # the op's speed-up over naive
