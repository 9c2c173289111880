"""A Pola vs softmax comparison of the paper, from training to the gain table
(``tools/reproduce.py``; docs/user_guides/reproduce.md).

:class:`Planner` turns a task and an arch into :class:`Step` s: plain command lines of
``tools/train.py`` / ``tools/test.py`` (``tools/dist_train.sh`` / ``dist_test.sh`` on
several GPUs) for the Pola config and its softmax baseline, each skipped when its results
are there; :func:`run_jobs` prints and runs them, then the gain table of each task
(:func:`polaformer_mm.analysis.gain_table.make_gain_table`, in this process).
"""
import argparse
import functools
import json
import os
import os.path as osp
import re
import shlex
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from mmengine.config import Config, DictAction

from polaformer_mm.analysis.gain_table import METRICS_FILE, make_gain_table, schedule_of
from polaformer_mm.models.family import families
from polaformer_mm.workflows import project_root

#: the folder of ``configs/`` and ``tools/`` (the repository, or an installed package's
#: ``.mim``)
REPO = project_root()

#: task -> description and whether the --tta test runs; the configs of each task are the
#: registered families' (``BackboneFamily.reproduce``: --arch name -> Pola config under
#: configs/)
_TASK_INFO = {
    'mask-rcnn-1x': dict(desc='COCO Mask R-CNN 1x', tta=False),
    'mask-rcnn-3x': dict(desc='COCO Mask R-CNN 3x (multi-scale + crop)', tta=False),
    'retinanet-1x': dict(desc='COCO RetinaNet 1x', tta=False),
    'semantic-fpn': dict(desc='ADE20K Semantic FPN 80k', tta=True),
    'upernet': dict(desc='ADE20K UperNet 160k', tta=True),
    'upernet-80k': dict(desc='ADE20K UperNet 80k', tta=True),
    'upernet-mln': dict(desc='ADE20K UperNet 160k with the multi-level neck', tta=True),
    'cascade-mask-rcnn-3x': dict(desc='COCO Cascade Mask R-CNN 3x (multi-scale + crop)', tta=False),
    'mask2former-coco': dict(desc='COCO Mask2Former instance segmentation', tta=False),
    'mask2former-coco-panoptic': dict(desc='COCO Mask2Former panoptic segmentation', tta=False),
    'mask2former-ade20k': dict(desc='ADE20K Mask2Former 160k', tta=False),
    'mask2former-cityscapes': dict(desc='Cityscapes Mask2Former 90k', tta=False),
    'semantic-fpn-cityscapes': dict(desc='Cityscapes Semantic FPN 80k', tta=True),
    'upernet-cityscapes': dict(desc='Cityscapes UperNet 80k', tta=True),
}


def tasks() -> Dict[str, dict]:
    """task -> dict(desc, tta, configs): every task with the configs the registered families
    give it (``BackboneFamily.reproduce``), the family order kept."""
    table = {}
    for task, info in _TASK_INFO.items():
        configs = {}
        for family in families():
            configs.update(family.reproduce.get(task, {}))
        table[task] = dict(info, configs=configs)
    return table


def __getattr__(name: str):
    """``TASKS``: :func:`tasks` at the time of the access."""
    if name == 'TASKS':
        return tasks()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def pola_config(task: str, arch: str) -> str:
    """The Pola config of (task, arch)."""
    return osp.join(REPO, 'configs', tasks()[task]['configs'][arch])


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
    """The protocol of a config: GPUs, images per GPU, schedule."""
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
                 check: Optional[Callable[[], None]] = None,
                 call: Optional[Callable[[], object]] = None,
                 needs: Optional[List[str]] = None):
        self.note, self.argv, self.env, self.check = note, argv, env or {}, check
        self.call = call  # does what argv does, in this process instead of a new one
        self.needs = needs or []  # local files the command reads

    def line(self) -> str:
        """The shell line of the step."""
        env = [f'{k}={shlex.quote(v)}' for k, v in self.env.items()]
        return ' '.join(env + [shlex.join(self.argv)])


class Planner:
    """Builds the steps of one (task, arch).

    Args:
        work_root (str): runs go to ``work_root/<config name>``.
        gpus (int, optional): GPUs per run; None: each config's protocol.
        cfg_options (Sequence[str]): ``KEY=VALUE`` strings passed to every train and test
            call, after the planner's own.
    """

    def __init__(self,
                 work_root: str = 'work_dirs',
                 gpus: Optional[int] = None,
                 cfg_options: Sequence[str] = ()):
        self.work_root = work_root
        self.gpus = gpus
        self.option_strings = list(cfg_options)
        self.options = parse_cfg_options(self.option_strings)

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
            self._batch_option(cfg, config, self.gpus or protocol_gpus(cfg, config))

    def run_steps(self, task: str, config: str, role: str) -> List[Step]:
        """Train (or resume, or skip), then test (or skip) one config."""
        cfg = load(config, self.options)
        gpus = self.gpus or protocol_gpus(cfg, config)
        train_strings = self._batch_option(cfg, config, gpus) + self.option_strings
        train_opts = ['--cfg-options'] + train_strings if train_strings else []
        opts = ['--cfg-options'] + self.option_strings if self.option_strings else []
        name = osp.splitext(osp.basename(config))[0]
        run_dir = osp.join(self.work_root, name)
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
        if tasks()[task]['tta']:
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

    def check_jobs(self, jobs: List[Tuple[str, List[str]]]) -> None:
        """:meth:`check_gpus` for every (task, arch) of ``jobs`` ((task, archs) pairs),
        before anything runs: a run must not stop at its second config for this."""
        for task, archs in jobs:
            for arch in archs:
                self.check_gpus(task, arch)

    def plan(self, task: str, arch: str) -> List[Step]:
        """The steps of (task, arch): its Pola config, then the softmax baseline."""
        pola = pola_config(task, arch)
        return (self.run_steps(task, pola, 'Pola')
                + self.run_steps(task, softmax_config(pola), 'softmax'))

    def table_step(self, task: str, planned: List[str]) -> Optional[Step]:
        """The gain table of the task's runs that have results or are ``planned``; None
        when there are none."""
        runs = []
        for arch in tasks()[task]['configs']:
            pola = pola_config(task, arch)
            for config in (pola, softmax_config(pola)):
                run_dir = osp.join(self.work_root, osp.splitext(osp.basename(config))[0])
                if run_dir in planned or _has_results(run_dir):
                    runs.append(_show(run_dir))
        if not runs:
            return None
        out = osp.join(self.work_root, f'gain_table_{task}')
        cache = osp.join(self.work_root, 'flops_cache.json')
        argv = [sys.executable, _show(osp.join(REPO, 'tools/analysis_tools/gain_table.py'))]
        argv += runs + ['--out', _show(out), '--flops-cache', _show(cache)]
        call = functools.partial(make_gain_table, runs, out=_show(out), flops_cache=_show(cache))
        return Step(f'{tasks()[task]["desc"]}: gain table', argv, call=call)


def parse_cfg_options(strings: Sequence[str]) -> Dict:
    """``k=v`` strings as ``--cfg-options`` of tools/train.py read them."""
    if not strings:
        return {}
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(['--cfg-options'] + list(strings)).cfg_options


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


def list_tasks() -> None:
    """Print the tasks, their archs, configs and cost."""
    for task, spec in tasks().items():
        print(f'{task}: {spec["desc"]}' + (' (also tested with --tta)' if spec['tta'] else ''))
        for arch in spec['configs']:
            pola = pola_config(task, arch)
            cfg = load(pola, None)
            print(f'  --arch {arch:7s} {_show(pola)}  vs  {osp.basename(softmax_config(pola))}'
                  f'  [{describe_cost(cfg, pola)}]')


def select_jobs(task: Optional[str] = None,
                arch: Optional[str] = None,
                all_tasks: bool = False) -> List[Tuple[str, List[str]]]:
    """(task, archs) pairs: every task and arch (``all_tasks``), every arch of ``task``
    (``arch='all'``) or the one (task, arch)."""
    if all_tasks:
        return [(t, list(spec['configs'])) for t, spec in tasks().items()]
    if arch == 'all':
        return [(task, list(tasks()[task]['configs']))]
    return [(task, [arch])]


def run_jobs(planner: Planner, jobs: List[Tuple[str, List[str]]], dry_run: bool = False) -> int:
    """Print and run (only print, with ``dry_run``) the steps of every (task, archs) pair,
    then each task's gain table; returns the exit status (1: a step failed)."""
    for task, archs in jobs:
        planned = []
        for arch in archs:
            print(f'# ===== {task} --arch {arch}: {tasks()[task]["desc"]}', flush=True)
            for step in planner.plan(task, arch):
                if not _do(step, dry_run):
                    return 1
            pola = pola_config(task, arch)
            planned += [
                osp.join(planner.work_root,
                         osp.splitext(osp.basename(c))[0]) for c in (pola, softmax_config(pola))
            ]
        table = planner.table_step(task, planned if dry_run else [])
        if table is not None and not _do(table, dry_run):
            return 1
    return 0


def _do(step: Step, dry_run: bool) -> bool:
    """Print the step and run it (not with ``dry_run``); False when it failed."""
    print(f'# {step.note}', flush=True)
    if step.argv is None:
        return True
    missing = [p for p in step.needs if not osp.isfile(p)]
    for path in missing:
        print(
            f'# needs {path}, which is missing (see tools/model_converters/official2mm.py; '
            'softmax2pola.py for a family without official Pola weights)',
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
            step.call()
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
