"""Time and peak memory of backbones side by side: the measurement behind
``tools/analysis_tools/benchmark_backbone.py`` (docs/user_guides/analysis_tools.md).

* Backbones: :func:`named_backbones` (``NAMED``: every registered family's, e.g.
  ``pola-pvt-t`` beside ``pvt-t``: the backbones of the repository's configs,
  ``BackboneFamily.benchmark``) or the ``model.backbone`` of config files, as *specs*
  (:func:`backbone_specs`), with constructor overrides (:func:`apply_overrides`).
* A measurement (:func:`measure`) runs ``warmup`` untimed steps, then ``repeat`` timed ones
  and reports their median, with the peak memory of :mod:`polaformer_mm.analysis.memory`.
  ``forward`` is an inference forward (eval mode, no autograd); ``train`` one training step of
  the backbone alone: forward in train mode and backward of ``sum(mean(out ** 2))`` over all
  outputs (gradients of every parameter; no optimizer step).
* :func:`run_all` runs every (backbone, job) measurement, each in a fresh process
  (:func:`run_isolated`: ``python -m polaformer_mm.analysis.benchmark PAYLOAD``) or in this
  one; :func:`compute_ratios` pairs ``pola-X`` with ``X`` (for config labels: the label with
  ``pola-`` removed). :mod:`polaformer_mm.analysis.benchmark_report` writes the table and
  the figure; :func:`exit_code` is the command line's exit status.
* :func:`check_memory_limit` accepts a ``--memory-limit`` only up to the machine's memory
  (:func:`machine_memory_gib`).
"""
import ast
import datetime
import importlib
import inspect
import json
import math
import os
import os.path as osp
import platform
import re
import site
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..models.family import families
from .memory import CpuMemory, CudaMemory, is_out_of_memory, limit_resident_memory, memory_note

__all__ = [
    'MODES', 'PRECISIONS', 'named_backbones', 'BenchmarkError', 'parse_size', 'parse_value',
    'parse_override', 'machine_memory_gib', 'check_memory_limit', 'clean_backbone_cfg',
    'backbone_specs', 'backbone_class', 'apply_overrides', 'build_backbone', 'measure', 'run_one',
    'run_isolated', 'worker_main', 'jobs_for', 'run_all', 'baseline_of', 'compute_ratios',
    'exit_code', 'environment', 'benchmark_data'
]

MODES = ('forward', 'train')
PRECISIONS = {'none': None, 'fp16': torch.float16, 'bf16': torch.bfloat16}
RESULT_PREFIX = '@@benchmark_backbone_result '
WORKER_MODULE = 'polaformer_mm.analysis.benchmark'  # the entry point of run_isolated


def named_backbones() -> Dict[str, dict]:
    """name -> dict(scope, cfg, config): the registry scope to build in, the backbone
    config, and the repo config (relative path) whose backbone it is; each registered
    family's (``BackboneFamily.benchmark``: ``pola-X`` beside its softmax baseline
    ``X``); a :class:`BenchmarkError` when two families give one name."""
    named, owner = {}, {}
    for family in families():
        for name, entry in family.benchmark().items():
            if name in named:
                raise BenchmarkError(f'the benchmark backbone {name!r} is named by the '
                                     f'families {owner[name]!r} and {family.name!r}: give '
                                     f'one of them another name (BackboneFamily.benchmark)')
            named[name], owner[name] = entry, family.name
    return named


def __getattr__(name: str):
    """``NAMED``: :func:`named_backbones` at the time of the access (families registered
    after this module's import included)."""
    if name == 'NAMED':
        return named_backbones()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


class BenchmarkError(ValueError):
    """A bad argument or an unusable backbone (the message names it)."""


# ------------------------------------------------------------------------ arguments
def parse_size(text: str) -> Tuple[int, int]:
    """'800x1333' -> (800, 1333) (height x width); '1024' -> (1024, 1024)."""
    m = re.fullmatch(r'\s*(\d+)\s*(?:[xX*]\s*(\d+))?\s*', text)
    if not m:
        raise BenchmarkError(f'--sizes: {text!r} is not HEIGHTxWIDTH (e.g. 800x1333) '
                             'or one number for a square')
    h = int(m.group(1))
    w = int(m.group(2)) if m.group(2) else h
    if h < 1 or w < 1:
        raise BenchmarkError(f'--sizes: {text!r} has a zero side')
    return h, w


def parse_value(text: str):
    """A Python literal (``None``, ``56``, ``'LLSS'``), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_override(text: str) -> Tuple[Optional[str], str, object]:
    """'[NAME:]KEY=VALUE' -> (NAME or None, KEY, value)."""
    target = None
    head, sep, value = text.partition('=')
    if not sep:
        raise BenchmarkError(f'--backbone-cfg {text!r}: expected [NAME:]KEY=VALUE')
    if ':' in head:
        target, head = head.split(':', 1)
    key = head.strip()
    if not key.isidentifier():
        raise BenchmarkError(f'--backbone-cfg {text!r}: {key!r} is not an argument name')
    return target, key, parse_value(value.strip())


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise BenchmarkError(message)


_CGROUP_LIMITS = ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes')


def machine_memory_gib() -> Optional[float]:
    """The memory a process of this machine can hold, in GiB: the physical memory
    (``MemTotal`` of ``/proc/meminfo``, else ``sysconf``), or the memory limit of this
    process's cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) where that is
    lower; None where neither is known."""
    sizes = []
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemTotal:'):
                    sizes.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not sizes:
        try:
            sizes.append(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))
        except (AttributeError, ValueError, OSError):
            pass
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():  # 'max': no limit
            sizes.append(int(text))
    sizes = [s for s in sizes if s > 0]
    return min(sizes) / 2**30 if sizes else None


def check_memory_limit(gib: Optional[float]) -> Optional[float]:
    """``--memory-limit``: None, or a finite number of GiB above 0 and at most
    :func:`machine_memory_gib` (a larger cap would never be reached before the machine
    swaps or its OOM killer strikes, which is what the limit is there to prevent).
    Returns it; a bad value raises :class:`BenchmarkError` naming it."""
    if gib is None:
        return None
    _require(math.isfinite(gib), f'--memory-limit must be a finite number of GiB, got {gib}')
    _require(gib > 0, f'--memory-limit must be > 0 GiB, got {gib}')
    total = machine_memory_gib()
    _require(
        total is None or gib <= total,
        f'--memory-limit {gib:g} GiB is more than the memory of this machine '
        f'({total:.2f} GiB): the limit caps each measuring process below the machine\'s '
        'memory, so that a measurement that does not fit fails as OOM instead of swapping')
    return gib


# ------------------------------------------------------------------------ backbones
def clean_backbone_cfg(cfg: dict) -> dict:
    """A copy of a config's backbone without what would load weights (``init_cfg``,
    ``pretrained``) or merge configs (``_delete_``)."""
    cfg = dict(cfg)
    for key in ('init_cfg', 'pretrained', '_delete_'):
        cfg.pop(key, None)
    return cfg


def backbone_specs(names: Sequence[str], configs: Sequence[str]) -> List[dict]:
    """One spec per backbone: label, scope, cfg, imports (modules to import first)."""
    specs = []
    for name in names:
        entry = named_backbones()[name]
        specs.append(
            dict(
                label=name,
                scope=entry['scope'],
                cfg=dict(entry['cfg']),
                imports=[],
                source=f'name ({entry["config"]})'))
    for path in configs:
        from mmengine.config import Config
        cfg = Config.fromfile(path)  # imports its custom_imports here
        if 'model' not in cfg or 'backbone' not in cfg.model:
            raise BenchmarkError(f'--config {path}: no model.backbone in the config')
        imports = list(cfg.get('custom_imports', {}).get('imports', []))
        specs.append(
            dict(
                label=osp.splitext(osp.basename(path))[0],
                scope=cfg.get('default_scope'),
                cfg=clean_backbone_cfg(cfg.model.backbone.to_dict()),
                imports=imports,
                source=path))
    labels = [s['label'] for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    _require(not dup, f'backbone(s) given twice: {dup}')
    return specs


def _registry(scope: Optional[str]):
    # the Pola backbones are in the root registry: importing polaformer_mm registers them
    if scope is None:
        from mmengine.registry import MODELS
        return MODELS
    try:
        return importlib.import_module(f'{scope}.registry').MODELS
    except ImportError as e:
        raise BenchmarkError(f'backbones of scope {scope!r} need the {scope} package, '
                             f'which does not import here: {e}') from None


def backbone_class(spec: dict):
    """The class a spec builds (its type looked up in the registry of its scope)."""
    registry = _registry(spec['scope'])
    if spec['scope'] is not None:
        importlib.import_module(f"{spec['scope']}.models")
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope(spec['scope']):
        cls = registry.get(spec['cfg']['type'])
    if cls is None:
        raise BenchmarkError(f"{spec['label']}: type {spec['cfg']['type']!r} is not "
                             f"registered in scope {spec['scope']!r}")
    return cls


def _accepts(cls, key: str) -> bool:
    params = inspect.signature(cls.__init__).parameters
    return key in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def apply_overrides(specs: List[dict], overrides: Sequence[str]) -> List[str]:
    """Apply ``[NAME:]KEY=VALUE`` overrides in place; returns what was applied."""
    applied = []
    labels = [s['label'] for s in specs]
    for text in overrides:
        target, key, value = parse_override(text)
        if target is not None:
            _require(target in labels, f'--backbone-cfg {text!r}: no backbone {target!r} '
                     f'(backbones: {labels})')
            chosen = [s for s in specs if s['label'] == target]
            cls = backbone_class(chosen[0])
            _require(
                _accepts(cls, key), f'--backbone-cfg {text!r}: {cls.__name__} has '
                f'no argument {key!r}')
        else:
            chosen = [s for s in specs if _accepts(backbone_class(s), key)]
            _require(
                bool(chosen), f'--backbone-cfg {text!r}: none of {labels} takes an '
                f'argument {key!r}')
        for spec in chosen:
            spec['cfg'][key] = value
            applied.append(f"{spec['label']}: {key}={value!r}")
    return applied


def build_backbone(spec: dict):
    """Build a spec's backbone with its own initialisation (no pretrained weights)."""
    for module in spec.get('imports', []):
        importlib.import_module(module)
    registry = _registry(spec['scope'])
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope(spec['scope']):
        model = registry.build(dict(spec['cfg']))
    model.init_weights()
    return model


# ------------------------------------------------------------------------- measuring
def _loss(outs) -> torch.Tensor:
    if isinstance(outs, torch.Tensor):
        outs = [outs]
    return sum(o.float().pow(2).mean() for o in outs)


def measure(model, mode: str, precision: str, height: int, width: int, batch: int,
            device: torch.device, warmup: int, repeat: int) -> dict:
    """Time ``warmup + repeat`` steps of ``model``; returns times and peak memory."""
    dtype = PRECISIONS[precision]
    x = torch.randn(batch, 3, height, width, device=device)
    train = mode == 'train'
    model.train(train)
    memory = CudaMemory(device) if device.type == 'cuda' else CpuMemory()

    def sync():
        if device.type == 'cuda':
            torch.cuda.synchronize(device)

    def step():
        if train:
            model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None), \
                torch.set_grad_enabled(train):
            outs = model(x)
            loss = _loss(outs) if train else None
        if train:
            loss.backward()
        del outs, loss

    memory.start()
    times = []
    for i in range(warmup + repeat):
        sync()
        start = time.perf_counter()
        step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    result = dict(
        times_s=times, time_s=statistics.median(times), memory=memory.kind, **memory.stop())
    model.zero_grad(set_to_none=True)
    return result


def _failure(exc: BaseException) -> dict:
    """The result of a measurement that raised ``exc``: 'oom' for an allocation failure,
    else 'error', with the error's text."""
    return dict(
        status='oom' if is_out_of_memory(exc) else 'error',
        error=f'{type(exc).__name__}: {exc}'[:2000])


def run_one(spec: dict, job: dict, model=None) -> dict:
    """One measurement in this process (builds the model unless given)."""
    device = torch.device(job['device'])
    if job.get('threads'):
        torch.set_num_threads(job['threads'])
    if model is None:
        model = build_backbone(spec).to(device)
    result = dict(
        status='ok',
        params_m=sum(p.numel() for p in model.parameters()) / 1e6,
        threads=torch.get_num_threads())
    try:
        result.update(
            measure(model, job['mode'], job['precision'], job['height'], job['width'], job['batch'],
                    device, job['warmup'], job['repeat']))
    except Exception as e:  # noqa: BLE001  (recorded per measurement; OOM is expected)
        result.update(_failure(e))
        model.zero_grad(set_to_none=True)
        if device.type == 'cuda':
            torch.cuda.empty_cache()
    return result


def _worker_env() -> Dict[str, str]:
    """The environment of a worker process: this one's, and where the ``polaformer_mm``
    imported here is not an installed one (a checkout), the folder that holds it first on
    ``PYTHONPATH``, so that the worker imports the same package."""
    env = dict(os.environ)
    root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    installed = site.getsitepackages() + [site.getusersitepackages()]
    if root not in {osp.abspath(p) for p in installed}:
        env['PYTHONPATH'] = os.pathsep.join([root] + [p for p in [env.get('PYTHONPATH')] if p])
    return env


def run_isolated(spec: dict, job: dict, timeout: Optional[float]) -> dict:
    """One measurement in a fresh Python process (``python -m
    polaformer_mm.analysis.benchmark PAYLOAD``, see :func:`worker_main`)."""
    payload = json.dumps(dict(spec=spec, job=job))
    cmd = [sys.executable, '-m', WORKER_MODULE, payload]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=_worker_env())
    except subprocess.TimeoutExpired:
        return dict(status='error', error=f'timed out after {timeout} s (--timeout)')
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    if proc.returncode == -9:
        return dict(
            status='oom',
            error='the measuring process was killed (SIGKILL; most '
            'likely out of memory)')
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    return dict(status='error', error=f'worker exited with {proc.returncode}: ' + '\n'.join(tail))


def worker_main(payload: str) -> None:
    """Run the measurement of a :func:`run_isolated` payload (JSON of ``spec`` and
    ``job``) in this process; print its result (or the error) as one JSON line."""
    data = json.loads(payload)
    try:
        if data['job'].get('memory_limit_gib'):
            limit_resident_memory(data['job']['memory_limit_gib'])
        result = run_one(data['spec'], data['job'])
    except Exception as e:  # noqa: BLE001  (build errors go back to the parent)
        result = _failure(e)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def jobs_for(settings: dict) -> List[dict]:
    """One job per (precision, mode, size, batch) of the settings, in that order."""
    return [
        dict(
            device=settings['device'],
            mode=mode,
            precision=precision,
            height=h,
            width=w,
            batch=b,
            warmup=settings['warmup'],
            repeat=settings['repeat'],
            threads=settings['threads'],
            memory_limit_gib=settings.get('memory_limit_gib'))
        for precision in settings['precisions'] for mode in settings['modes']
        for (h, w) in settings['sizes'] for b in settings['batches']
    ]


def _log(line: str) -> None:
    print(line, flush=True)


def _row(spec: dict, job: dict, res: dict) -> dict:
    return dict(
        backbone=spec['label'],
        mode=job['mode'],
        precision=job['precision'],
        height=job['height'],
        width=job['width'],
        batch=job['batch'],
        pixels=job['height'] * job['width'],
        **res)


def merge_rounds(rounds: List[dict]) -> dict:
    """One result from the results of the same measurement in several rounds: the first
    failure if one failed, else every round's timed steps, their median, and the largest
    peak memory of any round."""
    failed = [r for r in rounds if r['status'] != 'ok']
    if failed or len(rounds) == 1:
        return failed[0] if failed else rounds[0]
    merged = dict(rounds[0])
    merged['times_s'] = [t for r in rounds for t in r['times_s']]
    merged['time_s'] = statistics.median(merged['times_s'])
    for key in ('mem_peak_mib', 'mem_delta_mib'):
        if key in merged:
            merged[key] = max(r[key] for r in rounds)
    merged['rounds'] = len(rounds)
    return merged


def run_all(specs: List[dict], settings: dict, log=_log) -> List[dict]:
    """Every (backbone, job) measurement. In fresh processes the backbones take turns job
    by job (and, with ``settings['rounds']`` > 1, round by round within each job: the
    median of all rounds), so that the two sides of a ratio are measured close together in
    time (a machine's load drifts); in this process each backbone is built once and runs all
    its jobs before the next is built (on CUDA the peak memory then holds one model only),
    or, with rounds, every backbone is built first and they take turns as above."""
    jobs = jobs_for(settings)
    rounds = settings.get('rounds', 1)
    results = []
    if settings['isolate'] == 'process' or rounds > 1:
        device = torch.device(settings['device'])
        isolated = settings['isolate'] == 'process'
        models = None if isolated else [build_backbone(spec).to(device) for spec in specs]
        for job in jobs:
            runs = [[] for _ in specs]
            for r in range(rounds):
                for i, spec in enumerate(specs):
                    res = (
                        run_isolated(spec, job, settings['timeout']) if isolated else run_one(
                            spec, job, models[i]))
                    runs[i].append(res)
                    if rounds > 1:
                        log(f'round {r + 1}/{rounds}: ' + _progress_line(_row(spec, job, res)))
            for spec, spec_runs in zip(specs, runs):
                results.append(_row(spec, job, merge_rounds(spec_runs)))
                log(_progress_line(results[-1]))
    else:
        device = torch.device(settings['device'])
        for spec in specs:
            model = build_backbone(spec).to(device)
            for job in jobs:
                results.append(_row(spec, job, run_one(spec, job, model)))
                log(_progress_line(results[-1]))
            del model
            if device.type == 'cuda':
                torch.cuda.empty_cache()
    order = {s['label']: i for i, s in enumerate(specs)}
    return sorted(results, key=lambda r: order[r['backbone']])  # table: backbone by backbone


def _progress_line(r: dict) -> str:
    head = (f"{r['backbone']} {r['mode']} {r['precision']} {r['height']}x{r['width']} "
            f"b{r['batch']}: ")
    if r['status'] != 'ok':
        return head + f"{r['status'].upper()} {r.get('error', '')}".strip()
    return head + (f"{r['time_s'] * 1e3:.1f} ms, {_mib(r['mem_delta_mib'])} MiB delta, "
                   f"{_mib(r['mem_peak_mib'])} MiB peak")


def _mib(v) -> str:
    return '-' if v is None else f'{v:.0f}'


# --------------------------------------------------------------------------- ratios
def baseline_of(label: str, labels: Sequence[str]) -> Optional[str]:
    """The softmax baseline paired with ``label``: 'pola-X' -> 'X'; for config labels the
    label with 'pola-' removed (mask-rcnn_pola-pvt-t_... -> mask-rcnn_pvt-t_...)."""
    if 'pola-' not in label:
        return None
    base = label.replace('pola-', '', 1)
    return base if base in labels else None


def compute_ratios(results: List[dict]) -> List[dict]:
    """Pola / baseline ratios of time, memory delta and memory peak, for every job both
    sides of a pair measured successfully."""
    labels = list(dict.fromkeys(r['backbone'] for r in results))
    index = {
        (r['backbone'], r['mode'], r['precision'], r['height'], r['width'], r['batch']): r
        for r in results
    }
    ratios = []
    for label in labels:
        base = baseline_of(label, labels)
        if base is None:
            continue
        for (name, *key), r in index.items():
            if name != label:
                continue
            b = index.get((base, *key))
            if b is None or r['status'] != 'ok' or b['status'] != 'ok':
                continue
            mode, precision, h, w, batch = key
            ratios.append(
                dict(
                    pola=label,
                    baseline=base,
                    mode=mode,
                    precision=precision,
                    height=h,
                    width=w,
                    batch=batch,
                    time=r['time_s'] / b['time_s'],
                    mem_delta=(r['mem_delta_mib']
                               / b['mem_delta_mib'] if b['mem_delta_mib'] > 0 else None),
                    mem_peak=r['mem_peak_mib'] / b['mem_peak_mib']))
    return ratios


def exit_code(results: List[dict]) -> int:
    """The command line's exit status: 1 if a measurement failed for a reason other than
    memory, or if none ran at all (every one out of memory: nothing was measured), else 0
    (out of memory is a result: where a backbone stops fitting)."""
    failed = any(r['status'] == 'error' for r in results)
    return 1 if failed or not any(r['status'] == 'ok' for r in results) else 0


# ---------------------------------------------------------------------------- data
def environment(settings: dict) -> dict:
    """The device, library versions and threads the measurements ran with."""
    device = torch.device(settings['device'])
    if device.type == 'cuda':
        name = torch.cuda.get_device_name(device)
    else:
        name = f'CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)'
    from importlib import metadata
    versions = {}
    for key, dist in (('mmengine', 'mmengine'), ('mmcv', 'mmcv'), ('mmdet', 'mmdet'),
                      ('mmseg', 'mmsegmentation')):
        try:
            versions[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[key] = None
    return dict(
        device_name=name,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
        threads=settings['threads'] or torch.get_num_threads(),
        **versions)


def benchmark_data(command: str, specs: List[dict], settings: dict, overrides: List[str],
                   results: List[dict]) -> dict:
    """Everything a run measured, as ``benchmark_backbone.json`` holds it (with the
    ratios; ``command`` is the command line that ran it)."""
    return dict(
        command=command,
        date=datetime.datetime.now().isoformat(timespec='seconds'),
        env=environment(settings),
        settings=dict(settings, sizes=[list(s) for s in settings['sizes']]),
        memory_note=memory_note(settings['device_type'], settings['isolate']),
        backbones={
            s['label']: dict(scope=s['scope'], cfg=s['cfg'], source=s['source'])
            for s in specs
        },
        overrides=overrides,
        results=results,
        ratios=compute_ratios(results))


if __name__ == '__main__':  # the worker of run_isolated
    if len(sys.argv) != 2:
        sys.exit('usage: python -m polaformer_mm.analysis.benchmark PAYLOAD (the JSON of '
                 'run_isolated; the command line is tools/analysis_tools/benchmark_backbone.py)')
    worker_main(sys.argv[1])
