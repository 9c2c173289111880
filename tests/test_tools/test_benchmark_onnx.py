"""tools/analysis_tools/benchmark_onnx.py and polaformer_mm.deployment.benchmark: a run
goes on past a config that fails (its row says why), exports mmdet's PVT at the opset it
needs, prints only the table (one progress line per export), and writes the table as
Markdown and its rows as JSON; bad arguments are named."""
import json

import pytest

from polaformer_mm.deployment import benchmark, run_seconds
from tests import REPO
from .._tools import load_tool

cli = load_tool('analysis_tools/benchmark_onnx.py', '_benchmark_onnx')

NANO = f'{REPO}/configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py'
PVT_T = f'{REPO}/configs/pola_pvt/mask-rcnn_pvt-t_fpn_1x_coco.py'


def test_table_says_why_a_row_failed():
    ok = benchmark.BenchmarkRow('a.py', 'backbone', 'PolaPVT stage maps', 64, 80, 11, 0.02, 0.01)
    bad = benchmark.BenchmarkRow('b.py', 'backbone', '', 64, 64, None, None, None,
                                 'ValueError: a | b')
    assert ok.ratio == pytest.approx(2.0) and bad.ratio is None
    lines = benchmark.format_markdown([ok, bad]).splitlines()
    assert lines[0].startswith('| config | exported | input | opset |')
    assert lines[2] == '| a.py | PolaPVT stage maps | 64x80 | 11 | 20.0 | 10.0 | 2.00x |'
    assert lines[3] == '| b.py | backbone | 64x64 | - | failed: ValueError: a / b | | |'


def test_only_missing_operators_move_to_the_next_opset():
    assert benchmark.missing_operator_opset(
        RuntimeError("Exporting the operator 'aten::unflatten' to ONNX opset version 11 is "
                     'not supported'))
    assert not benchmark.missing_operator_opset(FileNotFoundError('config file not found'))


def test_run_seconds_times_the_calls_after_the_warmup():
    calls = []
    times = run_seconds(lambda: calls.append(len(calls)), repeats=3, warmup=2)
    assert calls == [0, 1, 2, 3, 4] and len(times) == 3 and all(s >= 0 for s in times)


def _prepared(name, made, fail_in_round=None, error=None):
    """A PreparedRun whose calls take no time; ``made`` gets its name whenever its calls
    are made; from round ``fail_in_round`` on its onnxruntime call raises."""
    row = benchmark.BenchmarkRow(name, 'backbone', 'what', 8, 8, None if error else 11, None, None,
                                 error)
    calls = []

    def session_run():
        calls.append(1)
        if fail_in_round is not None and len(calls) > 2 * (fail_in_round - 1):
            raise RuntimeError('session failed\nsecond line')

    def make():
        made.append(name)
        return (lambda: None), session_run

    return benchmark.PreparedRun(row, None if error else make)


def test_rounds_time_every_row_in_turn_and_keep_failures():
    made, rounds = [], []
    prepared = [
        _prepared('a.py', made),
        _prepared('b.py', made, error='FileNotFoundError: b.py'),
        _prepared('c.py', made, fail_in_round=2),
        _prepared('d.py', made),
    ]
    rows = benchmark.time_prepared(prepared, repeats=2, warmup=0, rounds=3, progress=rounds.append)
    assert rounds == [1, 2, 3]
    # the calls of every row are made once, in the first round, and kept for the others
    assert made == ['a.py', 'c.py', 'd.py']
    assert [r.error for r in rows
            ] == [None, 'FileNotFoundError: b.py', 'RuntimeError: session failed', None]
    assert all(r.torch_s >= 0 and r.onnxruntime_s >= 0 for r in (rows[0], rows[3]))
    assert rows[2].torch_s is None and rows[1].opset is None


X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse4_2 avx avx2 avx512f avx512bw

processor\t: 1
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse4_2 avx avx2 avx512f avx512bw
"""
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes sve
CPU implementer\t: 0x41
"""


@pytest.mark.parametrize('cpuinfo, described', [
    (X86, 'AMD EPYC 9R14, AVX-512'),
    (X86.replace(' avx512f avx512bw', ''), 'AMD EPYC 9R14, AVX2'),
    (X86.replace('sse4_2 avx avx2 avx512f avx512bw', ''), 'AMD EPYC 9R14'),
])
def test_cpu_is_named_with_its_widest_vector_extension(cpuinfo, described):
    assert benchmark.cpu_description(cpuinfo) == described


def test_cpu_without_a_model_line_falls_back_to_the_platform(monkeypatch):
    monkeypatch.setattr(benchmark.platform, 'processor', lambda: '')
    monkeypatch.setattr(benchmark.platform, 'machine', lambda: 'aarch64')
    assert benchmark.cpu_description(ARM) == 'aarch64, SVE'
    assert benchmark.cpu_description('') == 'aarch64'
    monkeypatch.setattr(benchmark.platform, 'machine', lambda: '')
    assert benchmark.cpu_description('') == '?'


@pytest.mark.parametrize('args, message', [
    (['a.py', '64'], 'CONFIG H W triples'),
    (['a.py', '64', 'x'], 'no integer H W'),
    (['a.py', '64', '64', '--repeats', '0'], '--repeats and --rounds must be >= 1'),
    (['a.py', '64', '64', '--rounds', '0'], '--repeats and --rounds must be >= 1'),
    (['a.py', '64', '64', '--threads', '0'], '--threads must be >= 1'),
    (['a.py', '64', '64', '--out-md', '/no/such/folder/t.md'
      ], '--out-md /no/such/folder/t.md: the folder /no/such/folder does not exist'),
    (['a.py', '64', '64', '--out-md', 'b.txt', '--out-json', 'b.txt'
      ], '--out-md and --out-json both name b.txt: one output would overwrite the other'),
])
def test_bad_arguments_are_named(args, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(args)
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_run_goes_on_past_a_failure_and_writes_markdown_and_json(tmp_path, capsys):
    md, js = tmp_path / 'table.md', tmp_path / 'rows.json'
    rows = cli.main([
        NANO, '64', '64', f'{REPO}/configs/no_such_config.py', '64', '64', PVT_T, '64', '64',
        '--parts', 'backbone', '--repeats', '1', '--warmup', '0', '--rounds', '2', '--threads', '1',
        '--out-md',
        str(md), '--out-json',
        str(js), '--work-dir',
        str(tmp_path / 'made' / 'here')
    ])
    assert len(list((tmp_path / 'made' / 'here').glob('*.onnx'))) == 2  # made, and kept
    out, err = capsys.readouterr()
    assert [r.error is None for r in rows] == [True, False, True]
    # the Pola model at mmdeploy's opset, mmdet's PVT at the first that has unflatten
    assert [r.opset for r in rows] == [11, None, 13]
    assert 'FileNotFoundError' in rows[1].error and 'no_such_config.py' in rows[1].error
    assert all(r.torch_s > 0 and r.onnxruntime_s > 0 for r in (rows[0], rows[2]))

    table = md.read_text()
    assert table.startswith('command: python tools/analysis_tools/benchmark_onnx.py ')
    body = table.split('\n\n', 1)[1].strip()
    # the header line and the table; the models' logs at warning level (mmdet's PVT says
    # it has no pre-trained weights)
    printed = [line for line in out.splitlines() if ' - mmengine - WARNING - ' not in line]
    assert '\n'.join(printed).strip() == body
    assert '| no_such_config.py | backbone | 64x64 | - | failed: FileNotFoundError' in table
    assert '| PyramidVisionTransformer stage maps | 64x64 | 13 |' in table
    progress = [line for line in err.splitlines() if line.startswith('[')]
    assert len(progress) == 3 and progress[2].startswith('[3/3] backbone of ')
    assert [line for line in err.splitlines()
            if line.startswith('timing')] == ['timing, round 1/2', 'timing, round 2/2']
    assert 'median of 2 runs (2 rounds over all rows of 1 runs after 0 untimed)' in out
    assert 'init_weights' not in out + err and 'Torch IR graph' not in out + err

    data = json.loads(js.read_text())
    assert 'onnxruntime' in data['env']['header']
    assert data['env']['cpu'] == benchmark.cpu_description()
    assert f"CPUs ({data['env']['cpu']})" in data['env']['header']
    assert [r['config'] for r in data['rows']] == [
        'mask-rcnn_pola-pvt-nano_fpn_synthetic.py', 'no_such_config.py',
        'mask-rcnn_pvt-t_fpn_1x_coco.py'
    ]
    first = data['rows'][0]
    assert first['ratio'] == pytest.approx(first['torch_s'] / first['onnxruntime_s'])
    assert data['rows'][1]['ratio'] is None and data['rows'][1]['error']


def test_output_paths_are_checked_before_any_export(tmp_path, capsys):
    """--out-md / --out-json / --work-dir that cannot be written: a usage error naming the
    option and the path, before the first export (which prints a progress line)."""
    blocker = tmp_path / 'a_file'
    blocker.write_text('')
    for option, path, reason in [
        ('--work-dir', blocker / 'onnx', 'cannot write there (NotADirectoryError'),
        ('--work-dir', blocker, 'not a folder'),
        ('--out-md', tmp_path, 'is a folder, not a file'),
        ('--out-json', blocker / 'rows.json', f'{blocker} is a file, not a folder'),
    ]:
        with pytest.raises(SystemExit) as exc:
            cli.main([NANO, '64', '64', '--parts', 'backbone', option, str(path)])
        assert exc.value.code == 2
        out, err = capsys.readouterr()
        assert f'error: {option} {path}: {reason}' in err
        assert out == '' and '[1/1]' not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['a_file']  # nothing left behind


def test_exit_code_is_an_error_when_no_row_was_timed():
    ok = benchmark.BenchmarkRow('a.py', 'backbone', 'w', 64, 64, 11, 0.02, 0.01)
    bad = benchmark.BenchmarkRow('b.py', 'backbone', '', 64, 64, None, None, None, 'E: x')
    assert benchmark.exit_code([ok, bad]) == 0
    assert benchmark.exit_code([bad, bad]) == 1
    assert benchmark.exit_code([]) == 1


@pytest.mark.slow
def test_run_where_every_row_failed_exits_1(tmp_path):
    """The script itself: every row failed, so the table (written) holds only reasons and
    the exit status is 1, with a line saying so and no traceback."""
    import subprocess
    import sys
    md = tmp_path / 'table.md'
    proc = subprocess.run([
        sys.executable, f'{REPO}/tools/analysis_tools/benchmark_onnx.py',
        f'{REPO}/configs/no_such_config.py', '64', '64', '--parts', 'backbone', 'tensor',
        '--out-md',
        str(md)
    ],
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert 'no row was timed: all 2 failed (the table says why)' in proc.stderr
    assert 'Traceback' not in proc.stderr
    assert md.read_text().count('| no_such_config.py |') == 2
    assert '| - | failed: FileNotFoundError' in proc.stdout


SEG_NANO = f'{REPO}/configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py'


def test_roofline_rates_and_fractions_come_from_the_flops_and_the_times():
    """Two FLOPs per counted multiply-add over the median onnxruntime time, against the
    peak; a row without a count names why, a failed row stays failed, columns line up."""
    counted = benchmark.BenchmarkRow('a.py', 'backbone', 'w', 64, 64, 11, 0.04, 0.01, flops=1e9)
    uncounted = counted._replace(config='b.py', flops=None, flops_error='ValueError: no count')
    failed = benchmark.BenchmarkRow('c.py', 'backbone', '', 64, 64, None, None, None, 'E: x')
    assert counted.flops_per_s == pytest.approx(2e11)
    assert benchmark.peak_fraction(counted, 4e11) == pytest.approx(0.5)
    assert uncounted.flops_per_s is None and failed.flops_per_s is None
    assert benchmark.peak_fraction(uncounted, 4e11) is None
    table = benchmark.format_markdown([counted, uncounted, failed], 4e11)
    lines = table.splitlines()
    assert '| FLOPs (G) | onnxruntime GFLOP/s | of peak |' in lines[0]
    assert lines[2].endswith('| 40.0 | 10.0 | 4.00x | 1.00 | 200.0 | 50.0% |')
    assert lines[3].endswith('| not counted: ValueError: no count | | |')
    assert len({line.count('|') for line in lines[:5]}) == 1
    assert 'matrix-product peak in onnxruntime: 400.0 GFLOP/s' in lines[-1]
    assert 'FLOPs (G)' not in benchmark.format_markdown([counted])  # no peak: no columns


def test_matmul_peak_is_a_positive_rate_and_bad_sizes_are_named():
    peak = benchmark.matmul_peak(threads=1, size=256, repeats=3, warmup=1)
    assert 1e8 < peak < 1e13  # FLOP/s of one core: above 0.1 GFLOP/s, below 10 TFLOP/s
    with pytest.raises(ValueError, match='size and repeats must be >= 1'):
        benchmark.matmul_peak(size=0)


def test_flops_are_counted_only_where_the_counter_covers_the_export():
    with pytest.raises(ValueError, match="not 'end2end'"):
        benchmark.count_flops(SEG_NANO, 'end2end', (64, 64))
    with pytest.raises(ValueError, match='backbone\\+neck of this config, the exported tensor'):
        benchmark.count_flops(NANO, 'tensor', (64, 64))


def test_roofline_with_end2end_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(['a.py', '64', '64', '--parts', 'backbone', 'end2end', '--roofline'])
    assert '--roofline counts the FLOPs of the backbone and tensor parts' in capsys.readouterr().err


@pytest.mark.slow
def test_roofline_run_counts_as_get_flops_and_measures_the_peak(tmp_path, capsys):
    """--roofline on a tiny segmentor: the backbone's and the tensor model's FLOPs are
    get_flops's at the same input, the peak was measured, the fractions lie in (0, 1]."""
    get_flops = load_tool('analysis_tools/get_flops.py', '_get_flops_for_roofline')
    js = tmp_path / 'rows.json'
    rows = cli.main([
        SEG_NANO, '64', '80', '--parts', 'backbone', 'tensor', '--repeats', '2', '--warmup', '1',
        '--threads', '1', '--roofline', '--out-json',
        str(js)
    ])
    expected = [
        get_flops.measure_configs([SEG_NANO], (64, 80), whole)[0]['flops']
        for whole in (False, True)
    ]
    assert [r.flops for r in rows] == expected and expected[0] < expected[1]
    data = json.loads(js.read_text())
    peak = data['env']['peak_flops_per_s']
    assert peak > 0
    for row, r in zip(data['rows'], rows):
        assert row['flops_per_s'] == pytest.approx(2 * r.flops / r.onnxruntime_s)
        assert 0 < row['of_peak'] <= 1
        assert row['of_peak'] == pytest.approx(row['flops_per_s'] / peak)
    out = capsys.readouterr().out
    assert f'matrix-product peak in onnxruntime: {peak / 1e9:.1f} GFLOP/s' in out
