"""tools/analysis_tools/benchmark_backbone.py and polaformer_mm.analysis.benchmark: a tiny
run writes the table, the JSON (its ratios computed from its own numbers) and the PNG; one
measurement in a fresh process; named backbones are the repo configs' backbones; bad
arguments are named errors."""
import json
import os.path as osp

import pytest
from mmengine.config import Config

from polaformer_mm.analysis import benchmark as bench
from tests import REPO
from .._tools import load_tool

cli = load_tool('analysis_tools/benchmark_backbone.py', '_benchmark_backbone')


def test_tiny_run_writes_table_json_png(tmp_path, capsys):
    out = tmp_path / 'out'
    rc = cli.main([
        '--backbones', 'pola-pvt-t', 'pvt-t', '--sizes', '64x64', '48x80', '--mode', 'forward',
        'train', '--repeat', '1', '--warmup', '0', '--threads', '1', '--isolate', 'none',
        '--out-dir',
        str(out)
    ])
    assert rc == 0
    printed = capsys.readouterr().out
    table = (out / 'benchmark_backbone.md').read_text()
    assert table in printed
    assert table.startswith('command: python ')
    assert '--backbones pola-pvt-t pvt-t' in table.splitlines()[0]
    assert '| pola-pvt-t | pvt-t | train | none | 48x80 | 1 |' in table

    data = json.loads((out / 'benchmark_backbone.json').read_text())
    assert set(data) >= {
        'command', 'env', 'settings', 'memory_note', 'backbones', 'results', 'ratios'
    }
    assert data['settings']['sizes'] == [[64, 64], [48, 80]]
    assert set(data['backbones']) == {'pola-pvt-t', 'pvt-t'}
    assert data['backbones']['pvt-t']['cfg']['type'] == 'PyramidVisionTransformer'
    rows = data['results']
    assert len(rows) == 2 * 2 * 2 and all(r['status'] == 'ok' for r in rows)
    for r in rows:
        assert set(r) >= {
            'backbone', 'mode', 'precision', 'height', 'width', 'batch', 'pixels', 'times_s',
            'time_s', 'mem_delta_mib', 'mem_peak_mib', 'params_m'
        }
        assert len(r['times_s']) == 1 and r['time_s'] == r['times_s'][0] > 0
        assert r['mem_peak_mib'] > 0 and r['pixels'] == r['height'] * r['width']
    assert len(data['ratios']) == 4
    index = {(r['backbone'], r['mode'], r['height'], r['width']): r for r in rows}
    for q in data['ratios']:
        assert (q['pola'], q['baseline']) == ('pola-pvt-t', 'pvt-t')
        p = index['pola-pvt-t', q['mode'], q['height'], q['width']]
        b = index['pvt-t', q['mode'], q['height'], q['width']]
        assert q['time'] == pytest.approx(p['time_s'] / b['time_s'])
        assert q['mem_peak'] == pytest.approx(p['mem_peak_mib'] / b['mem_peak_mib'])
        if b['mem_delta_mib'] > 0:
            assert q['mem_delta'] == pytest.approx(p['mem_delta_mib'] / b['mem_delta_mib'])
        assert f"| {q['time']:.2f} |" in table

    png = (out / 'benchmark_backbone.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10000


@pytest.mark.slow
def test_rounds_take_turns_and_report_the_median_of_all(tmp_path, capsys):
    """``--rounds 2``: every backbone is measured in each round (the rows of a round
    alternate), and the row holds both rounds' steps, their median and the larger peak."""
    out = tmp_path / 'out'
    rc = cli.main([
        '--backbones', 'pola-pvt-t', 'pvt-t', '--sizes', '48x64', '--mode', 'forward', '--repeat',
        '2', '--warmup', '0', '--rounds', '2', '--threads', '1', '--isolate', 'none', '--out-dir',
        str(out), '--no-plot'
    ])
    assert rc == 0
    printed = capsys.readouterr().out
    progress = [line.split(':')[0] for line in printed.splitlines() if line.startswith('round ')]
    assert progress == ['round 1/2', 'round 1/2', 'round 2/2', 'round 2/2']
    assert 'median of 2 steps in each of 2 rounds' in (out / 'benchmark_backbone.md').read_text()
    rows = json.loads((out / 'benchmark_backbone.json').read_text())['results']
    assert [r['backbone'] for r in rows] == ['pola-pvt-t', 'pvt-t']
    for r in rows:
        assert r['rounds'] == 2 and len(r['times_s']) == 4
        steps = sorted(r['times_s'])
        assert r['time_s'] == pytest.approx((steps[1] + steps[2]) / 2)
    merged = bench.merge_rounds([
        dict(status='ok', times_s=[1.0], time_s=1.0, mem_peak_mib=5., mem_delta_mib=1.),
        dict(status='ok', times_s=[3.0, 2.0], time_s=2.5, mem_peak_mib=4., mem_delta_mib=2.)
    ])
    assert (merged['time_s'], merged['mem_peak_mib'], merged['mem_delta_mib']) == (2.0, 5., 2.)
    oom = dict(status='oom', error='out of memory')
    assert bench.merge_rounds([merged, oom]) is oom


def test_isolated_measurement_reports_process_memory():
    """CPU default: a fresh process per measurement; its resident-memory delta counts
    the training step's activations and gradients, the peak the whole process."""
    spec = bench.backbone_specs(['pola-pvt-t'], [])[0]
    job = dict(
        device='cpu',
        mode='train',
        precision='none',
        height=64,
        width=96,
        batch=1,
        warmup=0,
        repeat=1,
        threads=1)
    res = bench.run_isolated(spec, job, timeout=300)
    assert res['status'] == 'ok', res
    assert res['memory'] == 'cpu-rss'
    assert res['mem_method'] in ('VmHWM after reset', 'ru_maxrss')
    # weights (13 M parameters, 52 MB) are loaded before the measurement: the delta holds
    # at least their gradients, the peak the torch libraries too
    assert res['mem_delta_mib'] > 40
    assert res['mem_peak_mib'] > res['mem_delta_mib'] + 100
    assert res['params_m'] == pytest.approx(13.0, abs=1.0)


@pytest.mark.slow
def test_memory_limit_names_where_a_backbone_stops_fitting(tmp_path):
    """--memory-limit: a measurement that would hold more than the limit fails as OOM
    (an allocation error in the measuring process, not the OOM killer); the report names
    the largest input that ran and the smallest that did not fit."""
    out = tmp_path / 'out'
    # 1.5 GiB: the libraries, weights and a 64x64 step fit; a 1536x1536 training step of
    # the softmax PVT-T (about 5 GB of activations) does not
    rc = cli.main([
        '--backbones', 'pvt-t', '--sizes', '64x64', '1536x1536', '--mode', 'train', '--repeat', '1',
        '--warmup', '0', '--threads', '1', '--memory-limit', '1.5', '--no-plot', '--out-dir',
        str(out)
    ])
    assert rc == 0  # out of memory is a result, not an error
    data = json.loads((out / 'benchmark_backbone.json').read_text())
    status = {(r['height'], r['width']): r for r in data['results']}
    assert status[64, 64]['status'] == 'ok'
    assert status[64, 64]['mem_peak_mib'] < 1.5 * 1024
    assert status[1536, 1536]['status'] == 'oom', status[1536, 1536]
    assert "can't allocate memory" in status[1536, 1536]['error']
    table = (out / 'benchmark_backbone.md').read_text()
    assert 'Where a backbone stops fitting (a limit of 1.5 GiB resident):' in table
    assert '| pvt-t | train | none | 1 | 64x64 | 1536x1536 |' in table


def test_memory_limit_needs_fresh_cpu_processes():
    with pytest.raises(SystemExit):
        cli.main(['--backbones', 'pvt-t', '--memory-limit', '8', '--isolate', 'none'])
    with pytest.raises(SystemExit):
        cli.main(['--backbones', 'pvt-t', '--memory-limit', '0'])


def test_out_of_memory_errors_are_recognised():
    from polaformer_mm.analysis.memory import is_out_of_memory
    assert is_out_of_memory(
        RuntimeError('[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: '
                     "can't allocate memory: you tried to allocate 3221225472 bytes."))
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB'))
    assert not is_out_of_memory(RuntimeError('shape mismatch'))


@pytest.mark.parametrize('name', sorted(bench.NAMED))
def test_named_backbones_are_the_configs_backbones(name):
    entry = bench.NAMED[name]
    cfg = Config.fromfile(osp.join(REPO, entry['config']))
    backbone = bench.clean_backbone_cfg(cfg.model.backbone.to_dict())
    ours = dict(entry['cfg'])
    # swin-b: the only Swin-B softmax config is mmseg's UperNet; its SwinTransformer has
    # the constructor of mmdet's, which the name builds (without mmseg)
    assert ours.pop('type') == backbone.pop('type').split('.')[-1]
    for key, value in ours.items():
        expected = backbone[key] if key in backbone else _default(entry, key)
        assert _same(value, expected), (key, value, expected)


def _default(entry, key):
    import inspect
    cls = bench.backbone_class(dict(entry, label='x'))
    return inspect.signature(cls.__init__).parameters[key].default


def _same(a, b):
    norm = (lambda v: list(v) if isinstance(v, (list, tuple)) else v)
    return norm(a) == norm(b)


def test_overrides_apply_by_name_or_by_argument():
    specs = bench.backbone_specs(['pola-pvt-t', 'pvt-t'], [])
    applied = bench.apply_overrides(specs, ["attn_types='LLSS'", 'pvt-t:num_layers=[1,1,1,1]'])
    assert applied == ["pola-pvt-t: attn_types='LLSS'", 'pvt-t: num_layers=[1, 1, 1, 1]']
    assert specs[0]['cfg']['attn_types'] == 'LLSS' and 'attn_types' not in specs[1]['cfg']
    assert specs[1]['cfg']['num_layers'] == [1, 1, 1, 1]
    assert bench.parse_override('pola-swin-t:linear_window_size=None') == ('pola-swin-t',
                                                                           'linear_window_size',
                                                                           None)
    with pytest.raises(bench.BenchmarkError, match="none of .* takes an argument 'nope'"):
        bench.apply_overrides(specs, ['nope=1'])
    with pytest.raises(
            bench.BenchmarkError, match="PyramidVisionTransformer has no "
            "argument 'attn_types'"):
        bench.apply_overrides(specs, ['pvt-t:attn_types=LLSS'])
    with pytest.raises(bench.BenchmarkError, match="no backbone 'swin-t'"):
        bench.apply_overrides(specs, ['swin-t:window_size=12'])


@pytest.mark.parametrize('args,message', [
    (['--backbones', 'pola-pvt-t', '--repeat', '0'], '--repeat must be >= 1, got 0'),
    (['--backbones', 'pola-pvt-t', '--warmup', '-1'], '--warmup must be >= 0'),
    (['--backbones', 'pola-pvt-t', '--rounds', '0'], '--rounds must be >= 1, got 0'),
    (['--backbones', 'pola-pvt-t', '--batch', '0'], '--batch values must be >= 1'),
    (['--backbones', 'pola-pvt-x'], "--backbones: unknown ['pola-pvt-x']"),
    ([], 'give --backbones and/or --config'),
    (['--backbones', 'pola-pvt-t', '--sizes', '800by1333'], "--sizes: '800by1333' is not"),
    (['--backbones', 'pola-pvt-t', '--amp', 'bf16'], '--amp bf16 needs --device cuda'),
    (['--backbones', 'pola-pvt-t', '--device', 'tpu'], '--device'),
    (['--backbones', 'pola-pvt-t', 'pola-pvt-t'], "given twice: ['pola-pvt-t']"),
    (['--config', 'no/such.py'], "--config: file(s) not found: ['no/such.py']"),
    (['--backbones', 'pola-pvt-t', '--backbone-cfg', 'novalue'], 'expected [NAME:]KEY=VALUE'),
])
def test_bad_arguments_are_named(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_config_files_pair_by_name(tmp_path):
    paths = [
        osp.join(REPO, 'configs/pola_pvt', f'retinanet_{n}_fpn_1x_coco.py')
        for n in ('pola-pvt-t', 'pvt-t')
    ]
    specs = bench.backbone_specs([], paths)
    labels = [s['label'] for s in specs]
    assert labels == ['retinanet_pola-pvt-t_fpn_1x_coco', 'retinanet_pvt-t_fpn_1x_coco']
    assert specs[0]['cfg']['type'] == 'PolaPVT' and 'init_cfg' not in specs[0]['cfg']
    assert bench.baseline_of(labels[0], labels) == labels[1]
    assert bench.baseline_of(labels[1], labels) is None


def _unwritable_dirs(tmp_path):
    """Folders no run can write in (root included): under a file, and a file itself."""
    blocker = tmp_path / 'a_file'
    blocker.write_text('')
    return [str(blocker / 'out'), str(blocker)]


def test_unwritable_out_dir_is_named_before_any_measurement(tmp_path, capsys):
    for out in _unwritable_dirs(tmp_path):
        with pytest.raises(SystemExit) as exc:
            cli.main(
                ['--backbones', 'pvt-t', '--sizes', '64', '--isolate', 'none', '--out-dir', out])
        assert exc.value.code == 2
        printed = capsys.readouterr()
        assert f'--out-dir {out}: ' in printed.err
        assert printed.out == ''  # no measurement ran (each prints a progress line)


@pytest.mark.slow
def test_unwritable_out_dir_exits_without_traceback(tmp_path):
    """The script itself: a usage error (exit 2) naming the option and path, at once."""
    import subprocess
    import sys
    import time
    out = _unwritable_dirs(tmp_path)[0]
    start = time.monotonic()
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/analysis_tools/benchmark_backbone.py'), '--backbones', 'pvt-t',
        'pola-pvt-t', '--sizes', '64', '512', '--out-dir', out
    ],
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert f'error: --out-dir {out}: cannot write there (NotADirectoryError' in proc.stderr
    assert 'Traceback' not in proc.stderr and proc.stdout == ''
    assert time.monotonic() - start < 60  # four fresh measuring processes would take longer


@pytest.mark.parametrize('value', ['inf', '-inf', 'nan', '1e30'])
def test_memory_limit_must_be_finite_and_fit_the_machine(value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(['--backbones', 'pvt-t', f'--memory-limit={value}'])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    if value == '1e30':
        assert 'error: --memory-limit 1e+30 GiB is more than the memory of this machine (' in err
    else:
        assert f'error: --memory-limit must be a finite number of GiB, got {float(value)}' in err


def test_memory_limit_bound_is_the_machine_memory():
    import os
    total = bench.machine_memory_gib()
    physical = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
    assert 0 < total <= physical * 1.001  # MemTotal, or a cgroup's smaller limit
    assert bench.check_memory_limit(total) == total
    assert bench.check_memory_limit(None) is None
    with pytest.raises(bench.BenchmarkError, match='more than the memory of this machine'):
        bench.check_memory_limit(total * 1.01)
    with pytest.raises(bench.BenchmarkError, match='must be > 0 GiB'):
        bench.check_memory_limit(0.0)


def test_exit_code_is_an_error_when_nothing_was_measured():
    ok, oom, error = dict(status='ok'), dict(status='oom'), dict(status='error')
    assert bench.exit_code([ok, oom]) == 0  # where a backbone stops fitting: a result
    assert bench.exit_code([oom, oom]) == 1  # nothing ran
    assert bench.exit_code([ok, error]) == 1
    assert bench.exit_code([]) == 1


@pytest.mark.slow
def test_run_whose_every_measurement_fails_exits_1(tmp_path):
    """A limit below what the measuring process already holds fails every measurement:
    the report is written (it says why) and the exit status is 1."""
    out = tmp_path / 'out'
    rc = cli.main([
        '--backbones', 'pvt-t', '--sizes', '64', '--mode', 'forward', '--repeat', '1', '--warmup',
        '0', '--threads', '1', '--memory-limit', '0.01', '--no-plot', '--out-dir',
        str(out)
    ])
    assert rc == 1
    data = json.loads((out / 'benchmark_backbone.json').read_text())
    assert [r['status'] for r in data['results']] == ['error']
    assert 'the process already holds' in data['results'][0]['error']
