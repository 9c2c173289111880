"""The GPU check: everything this project does on CUDA, in one run and one report folder
(``tools/gpu_check.py``, ``make gpu-check``; docs/advanced_guides/gpu_check.md).

:func:`run_gpu_check` probes what imports (in a fresh process), then runs the steps
(:data:`STEPS`: ``smoke``, ``tests``, ``benchmark``, ``train``), each in child processes
from the repository root, and writes ``report.json`` with every step's status, figures
and log files.
"""
import datetime
import json
import math
import os
import os.path as osp
import platform
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from types import SimpleNamespace
from typing import List, Optional, Sequence

from polaformer_mm.workflows import project_root

#: the folder of ``configs/``, ``tools/`` and ``tests/`` (the repository; an installed
#: package's ``.mim`` has no tests)
REPO = project_root()
STEPS = ('smoke', 'tests', 'benchmark', 'train')
QUICKSTART = {
    'det': 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py',
    'seg': 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py',
}
DET_SIZE = (800, 1333)  # height x width: mmdet's 1333x800 scale
BENCH_PAIRS = ['pola-pvt-t', 'pvt-t', 'pola-swin-t', 'swin-t']


def _run(cmd: List[str], log: str, timeout: float, env=None) -> dict:
    """Run ``cmd`` in the repo root, output into ``log``; returns rc and seconds."""
    start = time.perf_counter()
    with open(log, 'w') as f:
        f.write('$ ' + shlex.join(cmd) + '\n')
        f.flush()
        try:
            rc = subprocess.run(
                cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                env=env).returncode
        except subprocess.TimeoutExpired:
            rc = None
    return dict(
        rc=rc,
        seconds=round(time.perf_counter() - start, 1),
        log=osp.basename(log),
        timed_out=rc is None)


def _tail(log: str, n: int = 20) -> str:
    with open(log) as f:
        return ''.join(f.readlines()[-n:])


# ------------------------------------------------------------------------- environment
PROBE = r'''
import json, sys, traceback
out = {}
def attempt(name, fn):
    try:
        out[name] = fn()
    except BaseException as e:
        out[name] = {'error': f'{type(e).__name__}: {e}'}
def pkg():
    import polaformer_mm
    return polaformer_mm.__version__
attempt('polaformer_mm', pkg)
def ops():
    sys.path.insert(0, 'polaformer_mm/utils')
    import mmcv_ops
    ok, cuda, err = mmcv_ops.mmcv_cuda_ops_version()
    return {'compiled_ops': ok, 'cuda': cuda, 'error': err}
attempt('mmcv_ops', ops)
for mod in ('mmengine', 'mmcv', 'mmdet.models', 'mmseg.models', 'triton', 'pytest',
            'matplotlib'):
    def imp(mod=mod):
        m = __import__(mod)
        return getattr(m, '__version__', 'ok')
    attempt(mod, imp)
print('@@probe ' + json.dumps(out))
'''


def probe_environment(python: str) -> dict:
    """Which parts of the stack import, in a fresh process (a broken one cannot take
    the check down with it)."""
    proc = subprocess.run([python, '-c', PROBE],
                          cwd=REPO,
                          capture_output=True,
                          text=True,
                          timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith('@@probe '):
            return json.loads(line[len('@@probe '):])
    return {'error': (proc.stdout + proc.stderr)[-3000:]}


def _ok(value) -> bool:
    return value is not None and not (isinstance(value, dict) and 'error' in value)


def environment(torch) -> dict:
    """Python, torch, CUDA, cuDNN, driver and the GPUs of this machine."""
    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append(
            dict(
                name=p.name,
                capability=f'{p.major}.{p.minor}',
                memory_gib=round(p.total_memory / 2**30, 1)))
    driver = None
    try:
        driver = subprocess.run(
            ['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
            capture_output=True,
            text=True,
            timeout=60).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return dict(
        python=platform.python_version(),
        executable=sys.executable,
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version(),
        driver=driver,
        gpus=gpus,
        cuda_visible_devices=os.environ.get('CUDA_VISIBLE_DEVICES'))


# ------------------------------------------------------------------------------- steps
SMOKE = r'''
import json, math, torch
import polaformer_mm
from polaformer_mm import PolaPVT, PolaSwin
res = {}
for name, cls in (('pola-pvt-t', PolaPVT), ('pola-swin-t', PolaSwin)):
    torch.manual_seed(0)
    model = cls(arch='tiny', drop_path_rate=0.).cuda().train()
    x = torch.randn(2, 3, 800, 1333, device='cuda')
    for dtype in (None, torch.float16, torch.bfloat16):
        model.zero_grad(set_to_none=True)
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast('cuda', dtype=dtype, enabled=dtype is not None):
            outs = model(x)
        loss = sum(o.float().pow(2).mean() for o in outs)
        loss.backward()
        finite = all(bool(torch.isfinite(o).all()) for o in outs) and all(
            bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
        res[f'{name} {str(dtype).replace("torch.", "") if dtype else "float32"}'] = dict(
            loss=loss.item(), finite=finite,
            peak_mib=round(torch.cuda.max_memory_allocated() / 2**20))
print('@@smoke ' + json.dumps(res))
'''


def step_smoke(args, ctx) -> dict:
    """Pola-PVT-T and Pola-Swin-T forward and backward on CUDA, float32 and autocast
    (``args``: the settings of :func:`run_gpu_check`; ``ctx``: the report folder and
    the probe)."""
    log = osp.join(ctx['out'], 'smoke.log')
    if not _ok(ctx['probe'].get('polaformer_mm')):
        return dict(
            status='failed',
            reason='import polaformer_mm failed: '
            f"{ctx['probe'].get('polaformer_mm')}")
    run = _run([args.python, '-c', SMOKE], log, args.step_timeout)
    results = None
    with open(log) as f:
        for line in f:
            if line.startswith('@@smoke '):
                results = json.loads(line[len('@@smoke '):])
    if run['rc'] != 0 or results is None:
        return dict(status='failed', reason=f'exit {run["rc"]}: {_tail(log)}', **run)
    bad = [k for k, v in results.items() if not v['finite'] or not math.isfinite(v['loss'])]
    return dict(
        status='failed' if bad else 'passed',
        results=results,
        reason=f'non-finite: {bad}' if bad else None,
        **run)


def _junit_counts(path: str) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == 'testsuite' else list(root)
    counts = dict(tests=0, failures=0, errors=0, skipped=0)
    failed, skipped = [], {}
    for suite in suites:
        for case in suite.iter('testcase'):
            counts['tests'] += 1
            name = f"{case.get('classname')}::{case.get('name')}"
            for child in case:
                if child.tag in ('failure', 'error'):
                    counts['failures' if child.tag == 'failure' else 'errors'] += 1
                    failed.append(name)
                elif child.tag == 'skipped':
                    counts['skipped'] += 1
                    reason = child.get('message', '')
                    skipped[reason] = skipped.get(reason, 0) + 1
    counts['passed'] = counts['tests'] - counts['failures'] - counts['errors'] - \
        counts['skipped']
    return dict(counts=counts, failed=failed, skipped_reasons=skipped)


def cuda_test_files() -> List[str]:
    """Test files that hold CUDA tests (``pytest.mark.cuda``, the ``CUDA`` / ``cuda_test``
    marks of tests/_cuda.py or the ``cuda_param`` of tests/test_cuda/_devices.py), relative
    to the repo: only these are collected, so a CPU-only test module that needs a package
    this machine lacks cannot fail the step."""
    import glob
    found = []
    for path in sorted(glob.glob(osp.join(REPO, 'tests', '**', 'test_*.py'), recursive=True)):
        with open(path) as f:
            text = f.read()
        if ('mark.cuda' in text or 'cuda_param' in text
                or re.search(r'^from \S*_cuda import', text, re.M)):
            found.append(osp.relpath(path, REPO))
    return found


def step_tests(args, ctx) -> dict:
    """The CUDA tests of the suite (``pytest -m cuda`` on :func:`cuda_test_files`)."""
    if not _ok(ctx['probe'].get('pytest')):
        return dict(
            status='skipped',
            reason='pytest is not installed '
            f"({ctx['probe'].get('pytest')}); pip install pytest")
    log = osp.join(ctx['out'], 'pytest.log')
    xml = osp.join(ctx['out'], 'pytest.xml')
    files = cuda_test_files()
    if not files:
        return dict(status='failed', reason='no test file under tests/ has CUDA tests')
    run = _run([
        args.python, '-m', 'pytest', '-m', 'cuda', '-rs', '-q', '-p', 'no:cacheprovider',
        f'--junitxml={xml}', *files
    ], log, args.step_timeout)
    if not osp.isfile(xml):
        return dict(status='failed', reason=f'pytest wrote no report: {_tail(log)}', **run)
    res = _junit_counts(xml)
    c = res['counts']
    if c['failures'] or c['errors'] or run['rc'] not in (0, 5):
        status, reason = 'failed', f"{c['failures']} failed, {c['errors']} errors"
    elif c['passed'] == 0:
        status, reason = 'failed', 'no CUDA test ran (all skipped or none collected)'
    else:
        status, reason = 'passed', None
    return dict(status=status, reason=reason, **res, **run)


def step_benchmark(args, ctx) -> dict:
    """tools/analysis_tools/benchmark_backbone.py on CUDA, Pola against softmax."""
    backbones = list(BENCH_PAIRS)
    note = None
    if not _ok(ctx['probe'].get('mmdet.models')):
        backbones = [b for b in backbones if b.startswith('pola-')]
        note = ('softmax baselines skipped: they are mmdet modules and mmdet does not '
                f"import ({ctx['probe'].get('mmdet.models')})")
    log = osp.join(ctx['out'], 'benchmark.log')
    cmd = [
        args.python, 'tools/analysis_tools/benchmark_backbone.py', '--device', 'cuda',
        '--backbones', *backbones, '--sizes', '512x512', '800x1333', '1024x1024', '--batch', '2',
        '--mode', 'forward', 'train', '--amp', 'none', 'bf16', 'fp16', '--repeat',
        str(args.bench_repeat), '--warmup', '3', '--out-dir', ctx['out']
    ]
    if not _ok(ctx['probe'].get('matplotlib')):
        cmd.append('--no-plot')
    run = _run(cmd, log, args.step_timeout)
    path = osp.join(ctx['out'], 'benchmark_backbone.json')
    if run['rc'] is None or not osp.isfile(path):
        return dict(status='failed', reason=f'exit {run["rc"]}: {_tail(log)}', **run)
    with open(path) as f:
        data = json.load(f)
    bad = [
        f"{r['backbone']} {r['mode']} {r['precision']} {r['height']}x{r['width']}: "
        f"{r['status']}" for r in data['results'] if r['status'] != 'ok'
    ]
    ratios = {
        f"{q['pola']}/{q['baseline']} {q['mode']} {q['precision']} "
        f"{q['height']}x{q['width']} b{q['batch']}":
        dict(
            time=round(q['time'], 3),
            mem_delta=None if q['mem_delta'] is None else round(q['mem_delta'], 3))
        for q in data['ratios']
    }
    status = 'failed' if run['rc'] != 0 or bad else 'passed'
    return dict(
        status=status,
        reason='; '.join(bad) or None,
        note=note,
        ratios=ratios,
        files=['benchmark_backbone.md', 'benchmark_backbone.json'] +
        (['benchmark_backbone.png'] if '--no-plot' not in cmd else []),
        **run)


def _train_config(task: str, data_root: str, work_dir: str, iters: int, batch: int) -> str:
    """The quickstart config of ``task`` at 1333x800 for ``iters`` iterations, written
    into the report folder (no validation, no checkpoints, a loss logged every step)."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO, QUICKSTART[task]))
    cfg.work_dir = work_dir
    for split in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[split].dataset.data_root = data_root
    cfg.train_dataloader.batch_size = batch
    if task == 'det':
        for t in cfg.train_dataloader.dataset.pipeline:
            if t['type'] == 'Resize':
                t['scale'] = (DET_SIZE[1], DET_SIZE[0])
    else:
        cfg.model.data_preprocessor.size = DET_SIZE
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=10**9)
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    cfg.param_scheduler = [
        dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=min(10, iters))
    ]
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', by_epoch=False, interval=10**9, save_last=False)
    cfg.log_processor = dict(type='LogProcessor', window_size=1, by_epoch=False)
    path = osp.join(osp.dirname(work_dir), f'train_{task}_config.py')
    cfg.dump(path)
    return path


def _scalars(work_dir: str) -> List[dict]:
    import glob
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not files:
        return []
    with open(files[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


def train_one(args, ctx, task: str) -> dict:
    """A short AMP training of the quickstart config of ``task`` at 1333x800, judged by
    :func:`loss_verdict`; skipped when the stack lacks what the model needs."""
    probe = ctx['probe']
    ops = probe.get('mmcv_ops') or {}
    if task == 'det':
        if not _ok(probe.get('mmdet.models')):
            return dict(
                status='skipped', reason=f"mmdet does not import: {probe.get('mmdet.models')}")
        if not (isinstance(ops, dict) and ops.get('compiled_ops') and ops.get('cuda')):
            return dict(
                status='skipped',
                reason='Mask R-CNN needs mmcv ops built with CUDA; '
                f'this mmcv: {ops}')
    elif not _ok(probe.get('mmseg.models')):
        return dict(status='skipped', reason=f"mmseg does not import: {probe.get('mmseg.models')}")
    work = osp.join(ctx['out'], 'work', task)
    os.makedirs(work, exist_ok=True)
    cfg_path = _train_config(task, ctx['data_root'], work, args.train_iters, args.train_batch)
    log = osp.join(ctx['out'], f'train_{task}.log')
    run = _run([args.python, 'tools/train.py', cfg_path, '--amp', '--work-dir', work], log,
               args.step_timeout)
    rows = [r for r in _scalars(work) if 'loss' in r]
    if run['rc'] != 0 or not rows:
        return dict(status='failed', reason=f"exit {run['rc']}: {_tail(log)}", **run)
    return dict(loss_verdict(rows, args.train_iters), **run)


def loss_verdict(rows: List[dict], iters: int) -> dict:
    """Judge a short training from its logged scalars (one row per iteration): every
    loss finite, the mean of the last 10 below the mean of the first 10, all ``iters``
    iterations logged. Returns the status, the reason and the figures."""
    losses = [r['loss'] for r in rows]
    k = min(10, len(losses) // 2) or 1
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    finite = all(math.isfinite(v) for v in losses)
    falling = finite and last < first
    times = sorted(r['time'] for r in rows[k:] if 'time' in r)
    res = dict(
        iters=len(losses),
        loss_first=round(losses[0], 4),
        loss_last=round(losses[-1], 4),
        loss_mean_first=round(first, 4),
        loss_mean_last=round(last, 4),
        finite=finite,
        falling=falling,
        sec_per_iter=round(times[len(times) // 2], 4) if times else None,
        memory_mb=max((r.get('memory', 0) for r in rows), default=None))
    problems = [
        p for p, ok in (('a non-finite loss', finite), ('the loss did not fall', falling),
                        (f'{len(losses)} of {iters} iterations logged', len(losses) == iters))
        if not ok
    ]
    return dict(
        status='failed' if problems else 'passed', reason='; '.join(problems) or None, **res)


def step_train(args, ctx) -> dict:
    """The synthetic 1333x800 data, then :func:`train_one` for each quickstart task."""
    probe = ctx['probe']
    if not (_ok(probe.get('mmdet.models')) or _ok(probe.get('mmseg.models'))):
        return dict(status='skipped', reason='neither mmdet nor mmseg imports')
    data_root = osp.join(ctx['out'], 'work', 'synthetic_1333x800') + '/'
    from polaformer_mm.datasets import generate_synthetic_dataset
    generate_synthetic_dataset(data_root, num_train=16, num_val=2, img_size=DET_SIZE, seed=0)
    ctx['data_root'] = data_root
    tasks = {task: train_one(args, ctx, task) for task in QUICKSTART}
    statuses = {t['status'] for t in tasks.values()}
    status = ('failed' if 'failed' in statuses else 'passed' if 'passed' in statuses else 'skipped')
    reasons = [f'{k}: {v["reason"]}' for k, v in tasks.items() if v.get('reason')]
    return dict(status=status, reason='; '.join(reasons) or None, tasks=tasks)


STEP_FUNCS = dict(smoke=step_smoke, tests=step_tests, benchmark=step_benchmark, train=step_train)


# ------------------------------------------------------------------------------ report
def summary_lines(report: dict) -> List[str]:
    """The printed summary of a report."""
    lines = [f"GPU check: {report['verdict']}  ({report['out_dir']})"]
    env = report['env']
    gpus = ', '.join(f"{g['name']} (sm {g['capability']}, {g['memory_gib']} GiB)"
                     for g in env['gpus'])
    lines.append(f"  torch {env['torch']} CUDA {env['torch_cuda']}, {gpus}")
    for name, step in report['steps'].items():
        line = f"  {name:<10} {step['status']}"
        if step.get('reason'):
            line += f": {step['reason']}"
        lines.append(line[:400])
        if name == 'tests' and 'counts' in step:
            lines.append(f"             {step['counts']}")
        if name == 'benchmark':
            for key, q in (step.get('ratios') or {}).items():
                if ' train ' in key and ' 800x1333 ' in key:
                    lines.append(f"             {key}: time {q['time']}, mem {q['mem_delta']}")
        if name == 'train':
            for task, t in (step.get('tasks') or {}).items():
                if t['status'] == 'passed':
                    lines.append(f"             {task}: loss {t['loss_mean_first']} -> "
                                 f"{t['loss_mean_last']}, {t['sec_per_iter']} s/iter, "
                                 f"{t['memory_mb']} MB")
                else:
                    lines.append(f"             {task}: {t['status']}: {t.get('reason')}"[:400])
    return lines


def _cuda_torch():
    """torch when it imports and sees a CUDA GPU; else None, said on stderr."""
    try:
        import torch
    except ImportError as e:
        print(f'gpu-check: torch does not import ({e}); nothing to check', file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print(
            f'gpu-check needs a CUDA GPU, and torch sees none: torch {torch.__version__} '
            f'(built for CUDA {torch.version.cuda}), torch.cuda.is_available() is False, '
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}. Run it on "
            'a machine with an NVIDIA GPU, its driver and a CUDA build of torch.',
            file=sys.stderr)
        return None
    return torch


def _run_steps(args, ctx, report: dict, path: str) -> None:
    """Run the chosen steps in order, the report rewritten to ``path`` after each."""
    for name in STEPS:
        if name not in args.steps:
            continue
        print(f'gpu-check: {name} ...', flush=True)
        start = time.perf_counter()
        try:
            result = STEP_FUNCS[name](args, ctx)
        except Exception as e:  # noqa: BLE001  (one broken step must not lose the report)
            result = dict(status='failed', reason=f'{type(e).__name__}: {e}')
        result.setdefault('seconds', round(time.perf_counter() - start, 1))
        report['steps'][name] = result
        print(
            f"gpu-check: {name} {result['status']}" +
            (f": {result['reason']}"[:300] if result.get('reason') else ''),
            flush=True)
        with open(path, 'w') as f:
            json.dump(report, f, indent=1)


def run_gpu_check(out_dir: Optional[str] = None,
                  steps: Sequence[str] = STEPS,
                  train_iters: int = 50,
                  train_batch: int = 2,
                  bench_repeat: int = 10,
                  step_timeout: float = 1800,
                  python: Optional[str] = None) -> int:
    """Run the ``steps`` (in :data:`STEPS` order) into the report folder ``out_dir``
    (default ``work_dirs/gpu_check/<date-time>`` of the repository), each step's child
    processes with ``python`` (default: this interpreter) and at most ``step_timeout``
    seconds; print the summary. Returns the exit status: 0 when no step failed, 1 when one
    did, 2 without a usable GPU (said on stderr)."""
    args = SimpleNamespace(
        out_dir=out_dir,
        steps=list(steps),
        train_iters=train_iters,
        train_batch=train_batch,
        bench_repeat=bench_repeat,
        step_timeout=step_timeout,
        python=python or sys.executable)
    torch = _cuda_torch()
    if torch is None:
        return 2
    stamp = datetime.datetime.now().strftime('%Y%m%d_%H%M%S')
    out = osp.abspath(args.out_dir or osp.join(REPO, 'work_dirs', 'gpu_check', stamp))
    os.makedirs(out, exist_ok=True)
    report = dict(
        started=stamp,
        command=shlex.join([sys.executable] + sys.argv),
        out_dir=out,
        env=environment(torch),
        steps={},
        verdict='running')
    ctx = dict(out=out)
    ctx['probe'] = report['probe'] = probe_environment(args.python)
    path = osp.join(out, 'report.json')
    _run_steps(args, ctx, report, path)
    failed = [n for n, s in report['steps'].items() if s['status'] == 'failed']
    skipped = [n for n, s in report['steps'].items() if s['status'] == 'skipped']
    report['verdict'] = ('FAILED: ' + ', '.join(failed) if failed else 'passed' +
                         (f" (skipped: {', '.join(skipped)})" if skipped else ''))
    with open(path, 'w') as f:
        json.dump(report, f, indent=1)
    print('\n'.join(summary_lines(report)))
    return 1 if failed else 0
