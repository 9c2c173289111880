"""tools/reproduce.py and tools/analysis_tools/gain_table.py end to end on the synthetic data
(polaformer_mm.workflows.reproduce, polaformer_mm.analysis.gain_table).

One real run of ``reproduce.py semantic-fpn --arch pvt-t --gpus 1`` with the test-size
override (tests/_smoke.py as ``--cfg-options``): Pola-PVT-T and PVT-T Semantic FPN each
train for one iteration through tools/train.py, are tested at single scale and with
``--tta`` through tools/test.py, and the gain table is written. The table is then checked
against numbers read independently from the runs' own files.
"""
import csv
import glob
import json
import os
import os.path as osp
import shlex
import subprocess
import sys

import pytest
import torch

from polaformer_mm.analysis import gain_table
from polaformer_mm.workflows import reproduce
from .. import REPO
from .._smoke import smoke_cfg_options, synthetic_root
from .._tools import load_tool

POLA = 'fpn_pola-pvt-t_8xb2-40k_ade20k-512x512'
SOFTMAX = 'fpn_pvt-t_8xb2-40k_ade20k-512x512'


@pytest.fixture(scope='module')
def reproduce_tool():
    return load_tool('reproduce.py', 'reproduce_under_test')


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    """One reproduce.py call; returns (work root, stdout, the --cfg-options used)."""
    tmp = tmp_path_factory.mktemp('reproduce')
    data_root = synthetic_root(tmp)
    options = smoke_cfg_options(osp.join(REPO, 'configs/pola_pvt', POLA + '.py'), data_root)
    # the override applies to both configs: they differ in the backbone only
    assert options == smoke_cfg_options(
        osp.join(REPO, 'configs/pola_pvt', SOFTMAX + '.py'), data_root)
    work_root = tmp / 'runs'
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/reproduce.py'), 'semantic-fpn', '--arch', 'pvt-t', '--gpus', '1',
        '--work-root',
        str(work_root), '--cfg-options', *options
    ],
                          cwd=str(tmp),
                          capture_output=True,
                          text=True,
                          timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return work_root, proc.stdout, options


def _record(work_root, name, sub):
    with open(work_root / name / sub / 'test_metrics.json') as f:
        return json.load(f)


@pytest.mark.slow
def test_steps_are_plain_tool_calls_printed_before_they_run(run):
    work_root, out, _ = run
    commands = [
        shlex.split(line) for line in out.splitlines() if line.startswith(sys.executable + ' ')
    ]
    scripts = [osp.basename(c[1]) for c in commands]
    assert scripts == ['train.py', 'test.py', 'test.py'] * 2 + ['gain_table.py'], scripts
    train_pola = next(line for line in out.splitlines()
                      if line.startswith(sys.executable) and 'train.py' in line and POLA in line)
    assert out.index(train_pola) < out.index('Iter(train) [1/1]')
    for name in (POLA, SOFTMAX):
        assert (work_root / name / 'iter_1.pth').is_file()
        single, tta = _record(work_root, name, 'test'), _record(work_root, name, 'test_tta')
        assert single['tta'] is False and tta['tta'] is True
        assert single['checkpoint'] == str(work_root / name / 'iter_1.pth')
        assert 'mIoU' in single['metrics'] and 'mIoU' in tta['metrics']
        # the --tta test ran mmseg's SegTTAModel over the 6 scales x 2 flips of the config
        dumped = (work_root / name / 'test_tta' / f'{name}.py').read_text()
        assert "type='SegTTAModel'" in dumped and "type='TestTimeAug'" in dumped


@pytest.mark.slow
def test_gain_table_rows_and_deltas_from_the_runs_own_numbers(run):
    work_root, out, _ = run
    with open(work_root / 'gain_table_semantic-fpn.csv') as f:
        rows = list(csv.DictReader(f))
    assert [(r['backbone'], r['row']) for r in rows] == [('PVT-T', 'softmax'),
                                                         ('Pola-PVT-T', 'pola'),
                                                         ('Pola-PVT-T - PVT-T', 'delta')]
    soft, pola, delta = rows
    for row, name in ((soft, SOFTMAX), (pola, POLA)):
        assert row['config'] == name and row['schedule'] == '1 it'
        # the CSV keeps 4 decimals
        assert float(row['mIoU']) == pytest.approx(
            _record(work_root, name, 'test')['metrics']['mIoU'], abs=1e-4)
        assert float(row['mIoU_ms_flip']) == pytest.approx(
            _record(work_root, name, 'test_tta')['metrics']['mIoU'], abs=1e-4)
        # params: the backbone tensors of the run's own checkpoint
        state = torch.load(
            work_root / name / 'iter_1.pth', map_location='cpu', weights_only=True)['state_dict']
        n = sum(v.numel() for k, v in state.items() if k.startswith('backbone.'))
        assert abs(float(row['params_M']) - n / 1e6) < 1e-4
        assert row['flops_input'] == '512x512' and float(row['flops_G']) > 1
    for col in ('mIoU', 'mIoU_ms_flip', 'params_M', 'flops_G'):
        assert float(delta[col]) == pytest.approx(float(pola[col]) - float(soft[col]), abs=2e-4)
    md = (work_root / 'gain_table_semantic-fpn.md').read_text()
    assert '| Backbone | Params (M) | FLOPs (G) | Schedule | mIoU | mIoU(ms+flip) |' in md
    assert f"| Pola-PVT-T | {float(pola['params_M']):.2f} |" in md
    assert f"{float(delta['mIoU']):+.2f}" in md
    assert md.strip() in out  # printed too
    png = work_root / 'gain_table_semantic-fpn.png'
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    import matplotlib.image
    assert matplotlib.image.imread(str(png)).shape[0] > 100


@pytest.mark.slow
def test_chart_draws_the_deltas(run, tmp_path):
    work_root = run[0]
    runs = gain_table.collect_runs([str(work_root)])
    rows = gain_table.build_rows(runs,
                                 gain_table.FlopsCounter(True, str(work_root / 'flops_cache.json')))
    drawn = gain_table.plot_deltas(rows, str(tmp_path / 'chart.png'))
    delta = rows[-1]
    assert drawn == [(delta['group'], 'Pola-PVT-T - PVT-T', c, delta[c])
                     for c in ('mIoU', 'mIoU_ms_flip')]
    assert osp.getsize(tmp_path / 'chart.png') > 1000
    # a run alone gets no delta row and no chart
    alone = gain_table.build_rows([r for r in runs if r.stem == POLA],
                                  gain_table.FlopsCounter(False))
    assert [r['row'] for r in alone] == ['pola']
    assert gain_table.plot_deltas(alone, str(tmp_path / 'none.png')) == []
    assert not osp.exists(tmp_path / 'none.png')


@pytest.mark.slow
def test_second_call_skips_finished_steps_and_longer_runs_resume(run, monkeypatch):
    work_root, _, options = run
    monkeypatch.chdir(work_root.parent)
    planner = reproduce.Planner(str(work_root), 1, options)
    steps = planner.plan('semantic-fpn', 'pvt-t')
    assert [s.argv for s in steps] == [None] * 6, [s.note for s in steps]
    # the same runs made 2 iterations long: both resume from iter_1 and are tested again
    longer = [o.replace('train_cfg.max_iters=1', 'train_cfg.max_iters=2') for o in options]
    steps = reproduce.Planner(str(work_root), 1, longer).plan('semantic-fpn', 'pvt-t')
    trains = [s.argv for s in steps if s.argv and 'train.py' in s.argv[1]]
    assert len(trains) == 2 and all('--resume' in a for a in trains)
    tests = [s.argv for s in steps if s.argv and 'test.py' in s.argv[1]]
    assert len(tests) == 4 and all(a[3].endswith('iter_2.pth') for a in tests)


@pytest.mark.slow
def test_dry_run_all_prints_commands_of_existing_configs(reproduce_tool, capsys, tmp_path,
                                                         monkeypatch):
    monkeypatch.chdir(REPO)
    assert reproduce_tool.main(['--all', '--dry-run', '--work-root', str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not os.listdir(tmp_path), 'a dry run wrote something'
    configs = set()
    for line in out.splitlines():
        if line.startswith('#'):
            continue
        argv = shlex.split(line)
        if argv[0].startswith('PYTHON='):
            argv = argv[1:]
        script = osp.basename(argv[1])
        assert script in ('dist_train.sh', 'dist_test.sh', 'gain_table.py'), line
        if script != 'gain_table.py':
            assert osp.isfile(argv[2]), line
            configs.add(osp.abspath(argv[2]))
    # every Pola config of configs/pola_* and its baseline, nothing else
    expected = set()
    for path in glob.glob(osp.join(REPO, 'configs/pola_*/*pola-*.py')):
        expected |= {path, reproduce.softmax_config(path)}
    assert configs == expected
    # protocol GPU counts: 8 for COCO, UperNet and the PVT Semantic FPN, 4 for the PVTv2 one
    assert 'dist_train.sh configs/pola_pvt/fpn_pola-pvt-t_8xb2-40k_ade20k-512x512.py 8 ' in out
    assert 'dist_train.sh configs/pola_pvtv2/fpn_pola-pvtv2-b0_4xb4-80k_ade20k-512x512.py 4 ' in out
    assert 'dist_train.sh configs/pola_pvt/mask-rcnn_pola-pvt-t_fpn_1x_coco.py 8 ' in out
    assert 'mask-rcnn_pola-swin-s-p4-w7_fpn_ms-crop-3x_coco/epoch_36.pth' in out
    assert 'upernet_swin-b_8xb2-160k_ade20k-512x512/test_tta --tta' in out
    assert 'retinanet_pvt-l_fpn_1x_coco/test_tta' not in out  # detection: single scale
    # Cascade (no NxbM in the name: auto_scale_lr's 16 over 2 per GPU), Cityscapes, Mask2Former
    assert ('dist_train.sh configs/pola_pvt/cascade-mask-rcnn_pola-pvt-s_fpn_4conv1fc-giou_amp-'
            'ms-crop-3x_coco.py 8 ') in out
    assert 'dist_train.sh configs/pola_pvt/fpn_pvt-l_4xb2-80k_cityscapes-512x1024.py 4 ' in out
    assert 'fpn_pola-pvt-t_4xb2-80k_cityscapes-512x1024/test_tta --tta' in out
    assert 'mask2former_swin-s_8xb2-90k_cityscapes-512x1024/iter_90000.pth' in out
    assert 'mask2former_swin-t_8xb2-90k_cityscapes-512x1024/test_tta' not in out


def test_list_gpu_count_and_missing_weights(reproduce_tool, capsys, tmp_path, monkeypatch):
    assert reproduce_tool.main(['--list']) == 0
    out = capsys.readouterr().out
    assert 'mask-rcnn_pola-pvt-t_fpn_1x_coco.py  vs  mask-rcnn_pvt-t_fpn_1x_coco.py  ' \
        '[8 GPUs x 2 images (batch 16), 1x (12 ep)]' in out
    assert '[4 GPUs x 4 images (batch 16), 80k it]' in out
    assert '[8 GPUs x 2 images (batch 16), 160k it]' in out
    assert '3x (36 ep)' in out
    steps = reproduce.Planner(str(tmp_path), 2).plan('upernet', 'swin-t')
    train = steps[0].argv
    assert train[1].endswith('dist_train.sh') and train[3] == '2'
    assert train[-2:] == ['--cfg-options', 'train_dataloader.batch_size=8']
    # the Pola backbone's converted checkpoint is looked for before anything starts
    assert steps[0].needs == ['checkpoints/pola_swin_t_mm.pth']
    monkeypatch.chdir(tmp_path)
    assert reproduce._do(steps[0], dry_run=True)
    assert not reproduce._do(steps[0], dry_run=False)
    assert 'checkpoints/pola_swin_t_mm.pth not found' in capsys.readouterr().err
    assert not os.listdir(tmp_path)
    with pytest.raises(
            reproduce.GpuCountError,
            match=r'does not split evenly over 3 GPUs; --gpus takes a divisor of 16'):
        reproduce.Planner('work_dirs', 3).plan('upernet', 'swin-t')
    with pytest.raises(SystemExit):
        reproduce_tool.parse_args(['upernet', '--arch', 'pvt-t'])


def test_every_task_config_pairs_with_a_labelled_baseline():
    """Each Pola config of the kit has its softmax baseline beside it, and the gain table
    labels the two by family and size from their names (Pola-PVTv2-B0 / PVTv2-B0, ...)."""
    for task, spec in reproduce.TASKS.items():
        for arch in spec['configs']:
            pola = reproduce.pola_config(task, arch)
            base = reproduce.softmax_config(pola)
            assert osp.isfile(pola) and osp.isfile(base), (pola, base)
            labels = [
                gain_table.backbone_label(gain_table.Run(osp.splitext(osp.basename(p))[0]))
                for p in (pola, base)
            ]
            assert labels[0] == 'Pola-' + labels[1], (task, arch, labels)
            assert labels[1].lower() == arch, (task, arch, labels)


def test_gain_table_outputs_are_checked_before_any_measurement(tmp_path, capsys):
    """--out PREFIX and --flops-cache: a cache named like one of PREFIX's files, or a place
    that takes no file, is a usage error naming the option before any run is read or
    measured; a missing folder is made."""
    tool = load_tool('analysis_tools/gain_table.py', '_gain_table_cli')
    prefix = str(tmp_path / 'made' / 'gains')
    for argv, message in [
        ([str(tmp_path), '--out', prefix, '--flops-cache',
          prefix + '.csv'], f'--out (.csv) and --flops-cache both name {prefix}.csv'),
        ([str(tmp_path), '--flops-cache', str(tmp_path)], 'is a folder, not a file'),
    ]:
        with pytest.raises(SystemExit) as info:
            tool.parse_args(argv)
        assert info.value.code == 2 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    args = tool.parse_args([str(tmp_path), '--out', prefix, '--flops-cache', prefix + '.json'])
    assert args.out == prefix and list(tmp_path.iterdir()) == []
