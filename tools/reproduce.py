#!/usr/bin/env python
"""Reproduce a Pola vs softmax comparison: train both configs, evaluate, tabulate.

    python tools/reproduce.py TASK --arch ARCH [--gpus N] [--work-root DIR] [--dry-run]
                              [--cfg-options k=v ...]
    python tools/reproduce.py --all [--dry-run] [...]      # every task and arch
    python tools/reproduce.py --list                       # tasks, archs, configs, cost

For the Pola config of TASK / ARCH and its softmax baseline (the config of the same name
without ``pola-``), one after the other:

1. train: ``tools/train.py`` (``--gpus 1``) or ``tools/dist_train.sh CONFIG N``, work dir
   ``WORK_ROOT/<config name>`` (``tools/train.py``'s default with the default work root
   ``work_dirs``). Skipped when the final checkpoint (``epoch_<max>.pth`` /
   ``iter_<max>.pth``) is there; with ``--resume`` when the run has any checkpoint, so an
   interrupted run continues where it stopped.
2. test the final checkpoint at single scale: ``tools/test.py`` / ``tools/dist_test.sh``
   into ``WORK_ROOT/<config name>/test``; for segmentation also with ``--tta`` (multi-scale
   + flip) into ``.../test_tta``. Skipped when that folder's ``test_metrics.json`` already
   records the final checkpoint with the same ``--cfg-options``.

Then ``tools/analysis_tools/gain_table.py`` (run inside this process) tabulates every run
of the task found under the work root into ``WORK_ROOT/gain_table_<task>.{md,csv,png}``.

Each step is printed (a shell line; comments start with ``#``) before it runs, and
``--dry-run`` prints them without running anything. A failed step stops the script; the
same command again resumes. ``--gpus`` defaults to each config's protocol (``8xb2`` = 8
GPUs x 2 images); with another count the protocol's total batch is kept by setting
``train_dataloader.batch_size`` (total / N) on the command line; a count that does not
divide the total batch stops the script before anything runs, naming the counts that
do. ``--cfg-options`` go to every train and test call, after the script's own (data
paths, smaller test runs, ...).
"""
import argparse
import json
import os
import os.path as osp
import re
import shlex
import subprocess
import sys
from typing import Dict, List, Optional

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, osp.join(REPO, 'tools', 'analysis_tools'))

import gain_table  # noqa: E402  (imports polaformer_mm)
from gain_table import METRICS_FILE, schedule_of  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402


def _family(folder, pattern, archs):
    return {f'{folder.split("_")[-1]}-{a}': f'{folder}/{pattern.format(a)}' for a in archs}


# task -> description, whether the --tta test runs, arch -> Pola config (under configs/)
TASKS = {
    'mask-rcnn-1x':
    dict(
        desc='COCO Mask R-CNN 1x',
        tta=False,
        configs={
            **_family('pola_pvt', 'mask-rcnn_pola-pvt-{}_fpn_1x_coco.py', 'tsml'),
            **_family('pola_swin', 'mask-rcnn_pola-swin-{}-p4-w7_fpn_1x_coco.py', 'ts')
        }),
    'mask-rcnn-3x':
    dict(
        desc='COCO Mask R-CNN 3x (multi-scale + crop)',
        tta=False,
        configs=_family('pola_swin', 'mask-rcnn_pola-swin-{}-p4-w7_fpn_ms-crop-3x_coco.py', 'ts')),
    'retinanet-1x':
    dict(
        desc='COCO RetinaNet 1x',
        tta=False,
        configs=_family('pola_pvt', 'retinanet_pola-pvt-{}_fpn_1x_coco.py', 'tsml')),
    'semantic-fpn':
    dict(
        desc='ADE20K Semantic FPN 80k',
        tta=True,
        configs=_family('pola_pvt', 'fpn_pola-pvt-{}_4xb4-80k_ade20k-512x512.py', 'tsml')),
    'upernet':
    dict(
        desc='ADE20K UperNet 160k',
        tta=True,
        configs=_family('pola_swin', 'upernet_pola-swin-{}_8xb2-160k_ade20k-512x512.py', 'tsb')),
}


def pola_config(task: str, arch: str) -> str:
    return osp.join(REPO, 'configs', TASKS[task]['configs'][arch])


def softmax_config(pola_path: str) -> str:
    """The baseline next to a Pola config: the same name without ``pola-``."""
    name = osp.basename(pola_path)
    if 'pola-' not in name:
        raise ValueError(f'{pola_path}: not a Pola config name (no "pola-")')
    return osp.join(osp.dirname(pola_path), name.replace('pola-', '', 1))


def _show(path: str) -> str:
    """Paths under the current directory relative, others absolute."""
    path = osp.abspath(path)
    rel = osp.relpath(path)
    return path if rel.startswith('..') else rel


_LOADED: Dict[tuple, Config] = {}


def load(path: str, options: Optional[dict]) -> Config:
    """The config with ``options`` merged (read once per process; not to be changed)."""
    key = (osp.abspath(path), json.dumps(options or {}, sort_keys=True, default=str))
    if key not in _LOADED:
        if not osp.isfile(path):
            raise FileNotFoundError(f'config file not found: {path}')
        cfg = Config.fromfile(path)
        if options:
            cfg.merge_from_dict(options)
        _LOADED[key] = cfg
    return _LOADED[key]


def protocol_gpus(cfg: Config, path: str) -> int:
    """GPUs of the config's protocol: ``..._8xb2-...`` in the name, else the total batch
    ``auto_scale_lr.base_batch_size`` over the per-GPU ``train_dataloader.batch_size``."""
    m = re.search(r'_(\d+)xb(\d+)', osp.basename(path))
    if m:
        return int(m.group(1))
    base = (cfg.get('auto_scale_lr') or {}).get('base_batch_size')
    if not base:
        raise ValueError(f'{path}: no NxbM in the name and no auto_scale_lr.base_batch_size: '
                         'cannot tell the GPU count of its protocol')
    return max(1, int(base) // int(cfg.train_dataloader.batch_size))


def final_checkpoint(cfg: Config, path: str) -> str:
    """File name of the last checkpoint of a finished run (the CheckpointHook's
    ``save_last``)."""
    hook = (cfg.get('default_hooks') or {}).get('checkpoint') or {}
    if hook.get('out_dir'):
        raise ValueError(f'{path}: default_hooks.checkpoint.out_dir is set; reproduce.py '
                         'expects checkpoints in the work dir')
    train_cfg = cfg.train_cfg
    if train_cfg.get('type') == 'IterBasedTrainLoop' or 'max_iters' in train_cfg:
        return hook.get('filename_tmpl', 'iter_{}.pth').format(train_cfg['max_iters'])
    return hook.get('filename_tmpl', 'epoch_{}.pth').format(train_cfg['max_epochs'])


def describe_cost(cfg: Config, path: str) -> str:
    gpus = protocol_gpus(cfg, path)
    bs = int(cfg.train_dataloader.batch_size)
    return f'{gpus} GPUs x {bs} images (batch {gpus * bs}), {schedule_of(cfg)}'


class GpuCountError(ValueError):
    """``--gpus`` that cannot keep a config's protocol batch."""


class Step:
    """One command line (or a note about a skipped one)."""

    def __init__(self,
                 note: str,
                 argv: Optional[List[str]] = None,
                 env: Optional[Dict[str, str]] = None,
                 check=None,
                 call=None,
                 needs: Optional[List[str]] = None):
        self.note, self.argv, self.env, self.check = note, argv, env or {}, check
        self.call = call  # runs argv[2:] in this process instead of a new one
        self.needs = needs or []  # local files the command reads

    def line(self) -> str:
        env = [f'{k}={shlex.quote(v)}' for k, v in self.env.items()]
        return ' '.join(env + [shlex.join(self.argv)])


class Planner:
    """Builds the steps of one (task, arch)."""

    def __init__(self, args, options: Dict, option_strings: List[str]):
        self.args = args
        self.options = options
        self.option_strings = option_strings

    def _launch(self, script: str, dist_script: str, head: List[str], gpus: int, tail: List[str]):
        if gpus == 1:
            return [sys.executable, _show(osp.join(REPO, 'tools', script))] + head + tail, {}
        return (['bash', _show(osp.join(REPO, 'tools', dist_script))] + head + [str(gpus)] + tail, {
            'PYTHON': sys.executable
        })

    def _batch_option(self, cfg: Config, config: str, gpus: int) -> List[str]:
        """``train_dataloader.batch_size=...`` keeping the protocol's total batch on
        ``gpus`` GPUs; nothing when that is the protocol's count or the user sets it."""
        proto = protocol_gpus(cfg, config)
        if gpus == proto or 'train_dataloader.batch_size' in self.options:
            return []
        per_gpu = int(cfg.train_dataloader.batch_size)
        total = proto * per_gpu
        if total % gpus:
            counts = [n for n in range(1, total + 1) if total % n == 0]
            raise GpuCountError(
                f'--gpus {gpus}: the protocol batch of {osp.basename(config)} ({proto} GPUs x '
                f'{per_gpu} images = {total}) does not split evenly over {gpus} GPUs; --gpus '
                f'takes a divisor of {total} here ({", ".join(map(str, counts))}), or set '
                'train_dataloader.batch_size in --cfg-options')
        return [f'train_dataloader.batch_size={total // gpus}']

    def check_gpus(self, task: str, arch: str) -> None:
        """Raise :class:`GpuCountError` before anything runs when ``--gpus`` cannot keep
        the protocol batch of a config of (task, arch)."""
        pola = pola_config(task, arch)
        for config in (pola, softmax_config(pola)):
            cfg = load(config, self.options)
            self._batch_option(cfg, config, self.args.gpus or protocol_gpus(cfg, config))

    def run_steps(self, task: str, config: str, role: str) -> List[Step]:
        """Train (or resume, or skip), then test (or skip) one config."""
        cfg = load(config, self.options)
        gpus = self.args.gpus or protocol_gpus(cfg, config)
        train_strings = self._batch_option(cfg, config, gpus) + self.option_strings
        train_opts = ['--cfg-options'] + train_strings if train_strings else []
        opts = ['--cfg-options'] + self.option_strings if self.option_strings else []
        name = osp.splitext(osp.basename(config))[0]
        run_dir = osp.join(self.args.work_root, name)
        final = osp.join(run_dir, final_checkpoint(cfg, config))
        shown_cfg, shown_dir = _show(config), _show(run_dir)
        steps = []
        if osp.isfile(final):
            steps.append(Step(f'{role} {name}: trained ({_show(final)} exists)'))
        else:
            head = [shown_cfg]
            tail = ['--work-dir', shown_dir]
            latest = _latest_checkpoint(run_dir)
            note = f'{role} {name}: train'
            if latest:
                tail.append('--resume')
                note += f', resuming from {_show(latest)}'
            argv, env = self._launch('train.py', 'dist_train.sh', head, gpus, tail + train_opts)
            steps.append(
                Step(note, argv, env, check=lambda: _require(final), needs=_local_weights(cfg)))
        tests = [('test', False)]
        if TASKS[task]['tta']:
            tests.append(('test_tta', True))
        for sub, tta in tests:
            test_dir = osp.join(run_dir, sub)
            kind = 'multi-scale + flip (--tta)' if tta else 'single scale'
            if _tested(test_dir, final, tta, self.options):
                steps.append(
                    Step(f'{role} {name}: tested, {kind} '
                         f'({_show(osp.join(test_dir, METRICS_FILE))})'))
                continue
            tail = ['--work-dir', _show(test_dir)] + (['--tta'] if tta else []) + opts
            argv, env = self._launch('test.py', 'dist_test.sh', [shown_cfg, _show(final)], gpus,
                                     tail)
            steps.append(Step(f'{role} {name}: test, {kind}', argv, env))
        return steps

    def plan(self, task: str, arch: str) -> List[Step]:
        pola = pola_config(task, arch)
        return (self.run_steps(task, pola, 'Pola')
                + self.run_steps(task, softmax_config(pola), 'softmax'))

    def table_step(self, task: str, planned: List[str]) -> Optional[Step]:
        runs = []
        for arch in TASKS[task]['configs']:
            pola = pola_config(task, arch)
            for config in (pola, softmax_config(pola)):
                run_dir = osp.join(self.args.work_root, osp.splitext(osp.basename(config))[0])
                if run_dir in planned or _has_results(run_dir):
                    runs.append(_show(run_dir))
        if not runs:
            return None
        out = osp.join(self.args.work_root, f'gain_table_{task}')
        argv = [sys.executable, _show(osp.join(REPO, 'tools/analysis_tools/gain_table.py'))]
        argv += runs + [
            '--out',
            _show(out), '--flops-cache',
            _show(osp.join(self.args.work_root, 'flops_cache.json'))
        ]
        return Step(f'{TASKS[task]["desc"]}: gain table', argv, call=gain_table.main)


def _parse_options(strings: List[str]) -> Dict:
    """``k=v`` strings as ``--cfg-options`` of tools/train.py read them."""
    if not strings:
        return {}
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(['--cfg-options'] + strings).cfg_options


def _latest_checkpoint(run_dir: str) -> Optional[str]:
    from mmengine.runner import find_latest_checkpoint
    if not osp.isdir(run_dir):
        return None
    return find_latest_checkpoint(run_dir)


def _local_weights(cfg: Config) -> List[str]:
    """Local checkpoint files the backbone's ``init_cfg`` loads (URLs are downloaded)."""
    init = cfg.model.get('backbone', {}).get('init_cfg') or []
    return [
        i['checkpoint'] for i in (init if isinstance(init, list) else [init])
        if i.get('type') == 'Pretrained' and isinstance(i.get('checkpoint'), str)
        and '://' not in i['checkpoint']
    ]


def _require(path: str) -> None:
    if not osp.isfile(path):
        raise RuntimeError(f'training ended without writing {path} (check '
                           'default_hooks.checkpoint: save_last / filename_tmpl)')


def _normal(obj):
    return json.loads(json.dumps(obj, default=str))


def _tested(test_dir: str, final: str, tta: bool, options: Dict) -> bool:
    path = osp.join(test_dir, METRICS_FILE)
    if not (osp.isfile(path) and osp.isfile(final)):
        return False
    with open(path) as f:
        record = json.load(f)
    return (record.get('checkpoint') == osp.abspath(final) and bool(record.get('tta')) == tta
            and _normal(record.get('cfg_options') or {}) == _normal(options)
            and osp.getmtime(path) >= osp.getmtime(final))


def _has_results(run_dir: str) -> bool:
    return osp.isfile(osp.join(run_dir, 'test', METRICS_FILE))


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description='Train a Pola config and its softmax baseline, evaluate both and '
        'write the gain table',
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='tasks: ' + ', '.join(f'{t} ({", ".join(d["configs"])})' for t, d in TASKS.items()))
    p.add_argument('task', nargs='?', choices=list(TASKS), help='config family')
    p.add_argument(
        '--arch',
        help='backbone, e.g. pvt-t or swin-s (see --list); "all" for '
        'every arch of the task')
    p.add_argument('--all', action='store_true', help='every task and arch')
    p.add_argument('--list', action='store_true', help='print the tasks and exit')
    p.add_argument(
        '--gpus',
        type=int,
        default=None,
        help="GPUs per run (default: the config's protocol); 1 runs "
        'tools/train.py / tools/test.py directly')
    p.add_argument(
        '--work-root',
        default='work_dirs',
        help='runs go to WORK_ROOT/<config name> (default: work_dirs)')
    p.add_argument('--dry-run', action='store_true', help='print the commands only')
    p.add_argument(
        '--cfg-options',
        nargs='+',
        default=[],
        metavar='KEY=VALUE',
        help='passed to every tools/train.py and tools/test.py call')
    args = p.parse_args(argv)
    if args.list:
        return args
    if args.all:
        if args.task or args.arch:
            p.error('--all takes no TASK / --arch')
    elif not args.task or not args.arch:
        p.error('give TASK and --arch (or --all, or --list)')
    elif args.arch != 'all' and args.arch not in TASKS[args.task]['configs']:
        p.error(f'--arch {args.arch}: {args.task} has '
                f'{", ".join(TASKS[args.task]["configs"])}')
    if args.gpus is not None and args.gpus < 1:
        p.error('--gpus must be >= 1')
    for s in args.cfg_options:
        if '=' not in s:
            p.error(f'--cfg-options {s!r}: expected KEY=VALUE')
    return args


def list_tasks() -> None:
    for task, spec in TASKS.items():
        print(f'{task}: {spec["desc"]}' + (' (also tested with --tta)' if spec['tta'] else ''))
        for arch in spec['configs']:
            pola = pola_config(task, arch)
            cfg = load(pola, None)
            print(f'  --arch {arch:7s} {_show(pola)}  vs  {osp.basename(softmax_config(pola))}'
                  f'  [{describe_cost(cfg, pola)}]')


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        list_tasks()
        return 0
    planner = Planner(args, _parse_options(args.cfg_options), list(args.cfg_options))
    if args.all:
        jobs = [(t, list(spec['configs'])) for t, spec in TASKS.items()]
    elif args.arch == 'all':
        jobs = [(args.task, list(TASKS[args.task]['configs']))]
    else:
        jobs = [(args.task, [args.arch])]
    try:  # every config first: a run must not stop at the second config for this
        for task, archs in jobs:
            for arch in archs:
                planner.check_gpus(task, arch)
    except GpuCountError as err:
        sys.exit(f'reproduce.py: error: {err}')
    for task, archs in jobs:
        planned = []
        for arch in archs:
            print(f'# ===== {task} --arch {arch}: {TASKS[task]["desc"]}', flush=True)
            for step in planner.plan(task, arch):
                if not _do(step, args.dry_run):
                    return 1
            pola = pola_config(task, arch)
            planned += [
                osp.join(args.work_root,
                         osp.splitext(osp.basename(c))[0]) for c in (pola, softmax_config(pola))
            ]
        table = planner.table_step(task, planned if args.dry_run else [])
        if table is not None and not _do(table, args.dry_run):
            return 1
    return 0


def _do(step: Step, dry_run: bool) -> bool:
    print(f'# {step.note}', flush=True)
    if step.argv is None:
        return True
    missing = [p for p in step.needs if not osp.isfile(p)]
    for path in missing:
        print(
            f'# needs {path}, which is missing (see tools/model_converters/official2mm.py)',
            flush=True)
    print(step.line(), flush=True)
    if dry_run:
        return True
    if missing:
        print(
            f'# STOPPED before {step.note}: {", ".join(missing)} not found',
            file=sys.stderr,
            flush=True)
        return False
    if step.call is not None:  # the same tool, without starting another interpreter
        try:
            step.call(step.argv[2:])
            code = 0
        except Exception as e:  # noqa: BLE001  (reported like a failed command)
            print(f'{type(e).__name__}: {e}', file=sys.stderr)
            code = 1
    else:
        code = subprocess.run(step.argv, env=dict(os.environ, **step.env)).returncode
    if code != 0:
        print(
            f'# FAILED (exit {code}): {step.note}. Fix the cause and run the '
            'same reproduce.py command again: finished steps are skipped and the '
            'training resumes.',
            file=sys.stderr,
            flush=True)
        return False
    if step.check is not None:
        step.check()
    return True


if __name__ == '__main__':
    sys.exit(main())
