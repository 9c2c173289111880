#!/usr/bin/env python
"""Time and peak memory of backbones side by side: Pola backbones against their softmax
baselines, over input sizes, batch sizes and precisions.

    python tools/analysis_tools/benchmark_backbone.py \\
        --backbones pola-pvt-t pvt-t pola-swin-t swin-t \\
        --sizes 800x1333 1024x1024 --batch 1 --mode forward train --repeat 3

Backbones are given by name (``--backbones``) or as the ``model.backbone`` of config
files (``--config``; labelled by the file name). Names:

    pola-pvt-{t,s,m,l}  PolaPVT tiny/small/medium/large as in the Mask R-CNN configs
                        (configs/pola_pvt/mask-rcnn_pola-pvt-*_fpn_1x_coco.py)
    pvt-{t,s,m,l}       mmdet PyramidVisionTransformer, num_layers 2-2-2-2, 3-4-6-3,
                        3-4-18-3, 3-8-27-3 (configs/pola_pvt/mask-rcnn_pvt-*_fpn_1x_coco.py)
    pola-swin-{t,s,b}   PolaSwin tiny/small/base ('LLSS'; -t/-s as in the Mask R-CNN
                        configs, -b as in configs/pola_swin/upernet_pola-swin-b_*.py)
    swin-{t,s,b}        mmdet SwinTransformer with the sizes of the softmax baselines
                        (configs/pola_swin/mask-rcnn_swin-{t,s}-*.py, upernet_swin-b_*.py)

Pretrained weights are never loaded. A measurement runs ``--warmup`` untimed steps,
then ``--repeat`` timed ones and reports their median. ``forward`` is an inference
forward (eval mode, no autograd); ``train`` is one training step of the backbone
alone: forward in train mode and backward of ``sum(mean(out ** 2))`` over all outputs
(gradients of every parameter; no optimizer step).

Memory. CPU: every measurement runs in a fresh process (``--isolate process``, the
default there); the table gives the process's peak resident memory during the
measurement minus its resident memory right before it ("RSS delta": activations,
gradients, workspace), the JSON also the absolute peak ("max RSS": libraries, weights
and input included). The peak is the kernel's high-water mark (``VmHWM``), reset before
the measurement where Linux allows it, else ``getrusage`` (the whole process's peak).
CUDA: ``torch.cuda.max_memory_allocated`` after a reset; the table gives it minus the
memory allocated right before the measurement ("alloc delta"), the JSON also the
absolute peak ("max alloc"). On CUDA measurements run in this process by default.

``--amp fp16`` / ``bf16`` (CUDA only) run the forward under ``torch.autocast``;
several values give one column of results each. ``--backbone-cfg KEY=VALUE`` sets a
constructor argument of every backbone that takes it (an error if none does);
``NAME:KEY=VALUE`` sets it for the backbone labelled NAME only. VALUE is a Python
literal (``None``, ``56``, ``'LLSS'``) or else a string.

Outputs (``--out-dir``): ``benchmark_backbone.md`` (the table, the Pola / baseline
ratios and the command), ``benchmark_backbone.json`` and ``benchmark_backbone.png``
(time and memory against pixels per image, log-log, one line per backbone). Pairs for
the ratios: ``pola-X`` with ``X``; for configs, a label with ``pola-`` removed.
"""
import argparse
import ast
import datetime
import importlib
import inspect
import json
import os
import os.path as osp
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)

# polaformer_mm before anything that imports torchvision: keep this order
# isort: off
import polaformer_mm  # noqa: E402,F401  (before torchvision)
import torch  # noqa: E402
from polaformer_mm.models.backbones.pola_pvt import PolaPVT  # noqa: E402
from polaformer_mm.models.backbones.pola_swin import PolaSwin  # noqa: E402
# isort: on

MODES = ('forward', 'train')
PRECISIONS = {'none': None, 'fp16': torch.float16, 'bf16': torch.bfloat16}
RESULT_PREFIX = '@@benchmark_backbone_result '
OUT_STEM = 'benchmark_backbone'

# the sizes of the softmax baselines are those of the Pola archs (the classes' arch_zoo)
_PVT_ARCH = {'t': 'tiny', 's': 'small', 'm': 'medium', 'l': 'large'}
_SWIN_ARCH = {'t': 'tiny', 's': 'small', 'b': 'base'}
# drop path as in the repo's configs: detection 0.2 (t, s), UperNet 0.3 (b, the only
# size with no detection config)
_SWIN_DROP_PATH = {'t': 0.2, 's': 0.2, 'b': 0.3}


def _swin_sizes(arch: str) -> dict:
    """``embed_dims``, ``depths`` and ``num_heads`` of PolaSwin's ``arch``."""
    return {
        k: list(v) if isinstance(v, (list, tuple)) else v
        for k, v in PolaSwin.arch_zoo[arch].items()
    }


def _named_backbones() -> Dict[str, dict]:
    """name -> dict(scope, cfg, config): the registry scope to build in, the backbone
    config, and the repo config (relative path) whose backbone it is."""
    named = {}
    for k, arch in _PVT_ARCH.items():
        named[f'pola-pvt-{k}'] = dict(
            scope=None,
            cfg=dict(
                type='PolaPVT',
                arch=arch,
                attn_types='LLLL',
                drop_path_rate=0.1,
                out_indices=(0, 1, 2, 3)),
            config=f'configs/pola_pvt/mask-rcnn_pola-pvt-{k}_fpn_1x_coco.py')
        named[f'pvt-{k}'] = dict(
            scope='mmdet',
            cfg=dict(
                type='PyramidVisionTransformer', num_layers=list(PolaPVT.arch_zoo[arch]['depths'])),
            config=f'configs/pola_pvt/mask-rcnn_pvt-{k}_fpn_1x_coco.py')
    for k, arch in _SWIN_ARCH.items():
        config = ('configs/pola_swin/upernet_{}swin-b_8xb2-160k_ade20k-512x512.py'
                  if k == 'b' else 'configs/pola_swin/mask-rcnn_{}swin-%s-p4-w7_fpn_1x_coco.py' % k)
        named[f'pola-swin-{k}'] = dict(
            scope=None,
            cfg=dict(
                type='PolaSwin',
                arch=arch,
                attn_types='LLSS',
                window_size=7,
                drop_path_rate=_SWIN_DROP_PATH[k],
                out_indices=(0, 1, 2, 3)),
            config=config.format('pola-'))
        named[f'swin-{k}'] = dict(
            scope='mmdet',
            cfg=dict(
                type='SwinTransformer',
                **_swin_sizes(arch),
                window_size=7,
                mlp_ratio=4,
                qkv_bias=True,
                qk_scale=None,
                drop_rate=0.,
                attn_drop_rate=0.,
                drop_path_rate=_SWIN_DROP_PATH[k],
                patch_norm=True,
                out_indices=(0, 1, 2, 3),
                with_cp=False),
            config=config.format(''))
    return named


NAMED = _named_backbones()


class BenchmarkError(ValueError):
    """A bad argument or an unusable backbone (the message names it)."""


# ----------------------------------------------------------------------------- args
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description='Time and peak memory of backbones side by side (Pola vs softmax)',
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='names: ' + ' '.join(NAMED))
    p.add_argument(
        '--backbones', nargs='+', default=[], metavar='NAME', help='backbones by name (see below)')
    p.add_argument(
        '--config',
        nargs='+',
        default=[],
        metavar='FILE',
        help='config files whose model.backbone is measured')
    p.add_argument(
        '--sizes',
        nargs='+',
        default=['800x1333'],
        metavar='HxW',
        help='input sizes, height x width (default 800x1333)')
    p.add_argument(
        '--batch', nargs='+', type=int, default=[1], metavar='B', help='batch sizes (default 1)')
    p.add_argument(
        '--mode',
        nargs='+',
        default=['forward', 'train'],
        choices=MODES,
        help='forward (inference) and/or train (forward + backward)')
    p.add_argument(
        '--repeat',
        type=int,
        default=3,
        help='timed steps per measurement; the median is reported (default 3)')
    p.add_argument('--warmup', type=int, default=1, help='untimed steps before them (default 1)')
    p.add_argument('--device', default='cpu', help="'cpu' or 'cuda[:i]' (default cpu)")
    p.add_argument(
        '--amp',
        nargs='+',
        default=['none'],
        choices=list(PRECISIONS),
        help='autocast dtype(s) on CUDA; none = float32 (default)')
    p.add_argument(
        '--backbone-cfg',
        nargs='+',
        default=[],
        metavar='[NAME:]KEY=VALUE',
        help="constructor overrides, e.g. 'pola-swin-t:linear_window_size=None'")
    p.add_argument(
        '--isolate',
        choices=['auto', 'process', 'none'],
        default='auto',
        help='run each measurement in a fresh process (auto: on CPU only)')
    p.add_argument(
        '--threads', type=int, default=None, help='torch CPU threads (default: torch chooses)')
    p.add_argument(
        '--timeout',
        type=float,
        default=None,
        help='seconds one isolated measurement may take (default: no limit)')
    p.add_argument(
        '--out-dir',
        default=osp.join('work_dirs', 'benchmark_backbone'),
        help='where the table, JSON and PNG go (default work_dirs/benchmark_backbone)')
    p.add_argument('--no-plot', action='store_true', help='skip the PNG')
    p.add_argument('--worker', help=argparse.SUPPRESS)
    return p


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise BenchmarkError(message)


def validate(args: argparse.Namespace) -> dict:
    """Check the arguments; returns the parsed settings (raises BenchmarkError)."""
    _require(args.repeat >= 1, f'--repeat must be >= 1, got {args.repeat}')
    _require(args.warmup >= 0, f'--warmup must be >= 0, got {args.warmup}')
    _require(all(b >= 1 for b in args.batch), f'--batch values must be >= 1, got {args.batch}')
    _require(args.threads is None or args.threads >= 1,
             f'--threads must be >= 1, got {args.threads}')
    _require(args.timeout is None or args.timeout > 0, f'--timeout must be > 0, got {args.timeout}')
    _require(bool(args.backbones or args.config), 'give --backbones and/or --config')
    unknown = [n for n in args.backbones if n not in NAMED]
    _require(not unknown, f'--backbones: unknown {unknown}; names: {list(NAMED)}')
    missing = [c for c in args.config if not osp.isfile(c)]
    _require(not missing, f'--config: file(s) not found: {missing}')
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        raise BenchmarkError(f'--device {args.device!r}: {e}') from None
    _require(device.type in ('cpu', 'cuda'), f"--device must be cpu or cuda, got {args.device!r}")
    if device.type == 'cuda':
        _require(
            torch.cuda.is_available(),
            f'--device {args.device}: torch sees no CUDA GPU (torch {torch.__version__}, '
            f'built for CUDA {torch.version.cuda})')
    amp = list(dict.fromkeys(args.amp))
    _require(
        device.type == 'cuda' or amp == ['none'],
        f'--amp {" ".join(a for a in amp if a != "none")} needs --device cuda '
        '(CPU runs are float32)')
    sizes = list(dict.fromkeys(parse_size(s) for s in args.sizes))
    isolate = args.isolate if args.isolate != 'auto' else (
        'process' if device.type == 'cpu' else 'none')
    return dict(
        device=str(device),
        device_type=device.type,
        sizes=sizes,
        batches=list(dict.fromkeys(args.batch)),
        modes=list(dict.fromkeys(args.mode)),
        precisions=amp,
        repeat=args.repeat,
        warmup=args.warmup,
        isolate=isolate,
        threads=args.threads,
        timeout=args.timeout)


# ------------------------------------------------------------------------ backbones
def _clean_backbone_cfg(cfg: dict) -> dict:
    cfg = dict(cfg)
    for key in ('init_cfg', 'pretrained', '_delete_'):
        cfg.pop(key, None)
    return cfg


def backbone_specs(names: Sequence[str], configs: Sequence[str]) -> List[dict]:
    """One spec per backbone: label, scope, cfg, imports (modules to import first)."""
    specs = []
    for name in names:
        entry = NAMED[name]
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
                cfg=_clean_backbone_cfg(cfg.model.backbone.to_dict()),
                imports=imports,
                source=path))
    labels = [s['label'] for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    _require(not dup, f'backbone(s) given twice: {dup}')
    return specs


def _registry(scope: Optional[str]):
    # the Pola backbones are registered by the import of polaformer_mm above (which also
    # lets a CUDA torchvision import beside a CPU torch: mmdet imports torchvision)
    if scope is None:
        from mmengine.registry import MODELS
        return MODELS
    try:
        return importlib.import_module(f'{scope}.registry').MODELS
    except ImportError as e:
        raise BenchmarkError(f'backbones of scope {scope!r} need the {scope} package, '
                             f'which does not import here: {e}') from None


def backbone_class(spec: dict):
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
    for module in spec.get('imports', []):
        importlib.import_module(module)
    registry = _registry(spec['scope'])
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope(spec['scope']):
        model = registry.build(dict(spec['cfg']))
    model.init_weights()
    return model


# ------------------------------------------------------------------------- measuring
def _read_status_kib(field: str) -> Optional[int]:
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(field + ':'):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark to the current RSS (Linux >= 4.0)."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        return False
    return True


def _peak_rss_kib() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


class _CpuMemory:
    kind = 'cpu-rss'

    def start(self):
        self.before = _read_status_kib('VmRSS')
        self.method = 'VmHWM after reset' if (_reset_peak_rss() and self.before
                                              and _read_status_kib('VmHWM')) else 'ru_maxrss'
        if self.before is None:  # no /proc: resident size unknown before the run
            self.before = _peak_rss_kib()

    def stop(self) -> dict:
        peak = (_read_status_kib('VmHWM') if self.method.startswith('VmHWM') else _peak_rss_kib())
        return dict(
            mem_peak_mib=peak / 1024,
            mem_delta_mib=(peak - self.before) / 1024,
            mem_method=self.method)


class _CudaMemory:
    kind = 'cuda-allocated'

    def __init__(self, device):
        self.device = device

    def start(self):
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.before = torch.cuda.memory_allocated(self.device)

    def stop(self) -> dict:
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        return dict(
            mem_peak_mib=peak / 2**20,
            mem_delta_mib=(peak - self.before) / 2**20,
            mem_method='torch.cuda.max_memory_allocated')


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
    memory = _CudaMemory(device) if device.type == 'cuda' else _CpuMemory()

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


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or 'out of memory' in str(exc).lower()


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
        result.update(
            status='oom' if _is_oom(e) else 'error', error=f'{type(e).__name__}: {e}'[:2000])
        model.zero_grad(set_to_none=True)
        if device.type == 'cuda':
            torch.cuda.empty_cache()
    return result


def run_isolated(spec: dict, job: dict, timeout: Optional[float]) -> dict:
    """One measurement in a fresh Python process running this file as a worker."""
    payload = json.dumps(dict(spec=spec, job=job))
    cmd = [sys.executable, osp.abspath(__file__), '--worker', payload]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
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


def _worker_main(payload: str) -> None:
    data = json.loads(payload)
    try:
        result = run_one(data['spec'], data['job'])
    except Exception as e:  # noqa: BLE001  (build errors go back to the parent)
        result = dict(status='error', error=f'{type(e).__name__}: {e}'[:2000])
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def jobs_for(settings: dict) -> List[dict]:
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
            threads=settings['threads']) for precision in settings['precisions']
        for mode in settings['modes'] for (h, w) in settings['sizes'] for b in settings['batches']
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


def run_all(specs: List[dict], settings: dict, log=_log) -> List[dict]:
    """Every (backbone, job) measurement. In fresh processes the backbones take turns job
    by job, so that the two sides of a ratio are measured close together in time (a
    machine's load drifts); in this process each backbone is built once and runs all its
    jobs before the next is built (on CUDA the peak memory then holds one model only)."""
    jobs = jobs_for(settings)
    results = []
    if settings['isolate'] == 'process':
        for job in jobs:
            for spec in specs:
                results.append(_row(spec, job, run_isolated(spec, job, settings['timeout'])))
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
    return head + (f"{r['time_s'] * 1e3:.1f} ms, {_fmt_mib(r['mem_delta_mib'])} MiB delta, "
                   f"{_fmt_mib(r['mem_peak_mib'])} MiB peak")


# --------------------------------------------------------------------------- ratios
def baseline_of(label: str, labels: Sequence[str]) -> Optional[str]:
    """The softmax baseline paired with ``label``: 'pola-X' -> 'X'; for config labels the
    label with 'pola-' removed (mask-rcnn_pola-pvt-t_... -> mask-rcnn_pvt-t_...)."""
    if 'pola-' not in label:
        return None
    base = label.replace('pola-', '', 1)
    return base if base in labels else None


def compute_ratios(results: List[dict]) -> List[dict]:
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


# --------------------------------------------------------------------------- output
def _fmt_mib(v) -> str:
    return '-' if v is None else f'{v:.0f}'


def _fmt_ms(seconds) -> str:
    ms = seconds * 1e3
    return f'{ms:.1f}' if ms >= 100 else f'{ms:.2f}'


def _fmt_ratio(v) -> str:
    return '-' if v is None else f'{v:.2f}'


def memory_names(device_type: str) -> Tuple[str, str]:
    """(delta column, peak column) headers for the device's memory measure."""
    if device_type == 'cuda':
        return 'alloc delta (MiB)', 'max alloc (MiB)'
    return 'RSS delta (MiB)', 'max RSS (MiB)'


def format_report(data: dict) -> str:
    settings = data['settings']
    delta_name, peak_name = memory_names(settings['device_type'])
    env = data['env']
    lines = [
        f"command: {data['command']}",
        f"device: {env['device_name']}; torch {env['torch']}; threads {env['threads']}; "
        f"{settings['warmup']} warm-up + median of {settings['repeat']} steps; "
        f"isolation: {settings['isolate']}",
        f"memory: {data['memory_note']}",
        '',
        f'| backbone | mode | precision | input (HxW) | batch | params (M) | time (ms) | '
        f'{delta_name} | {peak_name} |',
        '|---|---|---|---|---:|---:|---:|---:|---:|',
    ]
    for r in data['results']:
        size = f"{r['height']}x{r['width']}"
        params = f"{r['params_m']:.2f}" if r.get('params_m') is not None else '-'
        if r['status'] == 'ok':
            cells = [
                _fmt_ms(r['time_s']),
                _fmt_mib(r['mem_delta_mib']),
                _fmt_mib(r['mem_peak_mib'])
            ]
        else:
            cells = [r['status'].upper(), '-', '-']
        lines.append(f"| {r['backbone']} | {r['mode']} | {r['precision']} | {size} | "
                     f"{r['batch']} | {params} | " + ' | '.join(cells) + ' |')
    if data['ratios']:
        lines += [
            '', f'Pola / baseline (below 1: Pola is faster / leaner); memory ratios '
            f'of the {delta_name.split(" (")[0]} and the {peak_name.split(" (")[0]}:', '',
            '| Pola | baseline | mode | precision | input (HxW) | batch | time | '
            'mem delta | mem peak |', '|---|---|---|---|---|---:|---:|---:|---:|'
        ]
        for q in data['ratios']:
            lines.append(f"| {q['pola']} | {q['baseline']} | {q['mode']} | {q['precision']} "
                         f"| {q['height']}x{q['width']} | {q['batch']} | "
                         f"{_fmt_ratio(q['time'])} | {_fmt_ratio(q['mem_delta'])} | "
                         f"{_fmt_ratio(q['mem_peak'])} |")
    failed = [r for r in data['results'] if r['status'] != 'ok']
    for r in failed:
        lines.append(f"\n{r['status'].upper()}: {r['backbone']} {r['mode']} "
                     f"{r['precision']} {r['height']}x{r['width']} b{r['batch']}: "
                     f"{r.get('error', '')}")
    if data['overrides']:
        lines += ['', 'overrides: ' + '; '.join(data['overrides'])]
    return '\n'.join(lines)


def draw(data: dict, path: str) -> None:
    """Time and memory delta against pixels per image (log-log), one line per backbone
    (and batch size); one column per (mode, precision)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    results = [r for r in data['results'] if r['status'] == 'ok']
    columns = list(dict.fromkeys((r['mode'], r['precision']) for r in data['results']))
    labels = list(dict.fromkeys(r['backbone'] for r in data['results']))
    batches = sorted({r['batch'] for r in data['results']})
    delta_name, _ = memory_names(data['settings']['device_type'])
    # one colour per Pola / baseline pair: Pola solid, the baseline dashed
    colours, styles = {}, {}
    cycle = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for label in labels:
        base = baseline_of(label, labels)
        if label in colours:
            continue
        colours[label] = cycle[len(set(colours.values())) % len(cycle)]
        styles[label] = '-'
        if base is not None:
            colours[base], styles[base] = colours[label], '--'
    fig, axes = plt.subplots(2, len(columns), figsize=(5.5 * len(columns), 8), squeeze=False)
    for col, (mode, precision) in enumerate(columns):
        panels = (('time_s', 1e3, 'time (ms)'), ('mem_delta_mib', 1, delta_name))
        for row, (key, scale, name) in enumerate(panels):
            ax = axes[row][col]
            for label in labels:
                for b in batches:
                    pts = sorted(
                        (r['pixels'], r[key] * scale) for r in results
                        if r['backbone'] == label and r['batch'] == b and r['mode'] == mode
                        and r['precision'] == precision and r[key] is not None and r[key] > 0)
                    if not pts:
                        continue
                    tag = label if len(batches) == 1 else f'{label} b{b}'
                    ax.plot([p[0] for p in pts], [p[1] for p in pts],
                            marker='o',
                            color=colours[label],
                            linestyle=styles[label],
                            label=tag)
            ax.set_xscale('log')
            ax.set_yscale('log')
            ax.set_xlabel('pixels per image (H x W)')
            ax.set_ylabel(name)
            ax.set_title(f'{mode}, {"float32" if precision == "none" else precision}')
            ax.grid(True, which='both', alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
    fig.suptitle(f"{data['env']['device_name']}, batch {', '.join(map(str, batches))}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def environment(settings: dict) -> dict:
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


MEMORY_NOTES = {
    'cpu': ('RSS delta = peak resident memory of the measuring process during the '
            'measurement minus its resident memory right before it; max RSS = that '
            'peak (libraries, weights and input included)'),
    'cuda': ('alloc delta = torch.cuda.max_memory_allocated during the measurement minus '
             'the memory allocated right before it; max alloc = that peak'),
}

IN_PROCESS_CPU_NOTE = (
    '. CAUTION: --isolate none on CPU: all measurements share one process, so after the '
    'first the memory figures count only growth beyond what the process already holds')


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(args.worker)
        return 0
    try:
        settings = validate(args)
        specs = backbone_specs(args.backbones, args.config)
        for spec in specs:  # every type resolves here, before any measurement
            backbone_class(spec)
        overrides = apply_overrides(specs, args.backbone_cfg)
    except BenchmarkError as e:
        parser.error(str(e))
    command = 'python ' + shlex.join([osp.relpath(osp.abspath(__file__))]
                                     + list(sys.argv[1:] if argv is None else argv))
    results = run_all(specs, settings)
    data = dict(
        command=command,
        date=datetime.datetime.now().isoformat(timespec='seconds'),
        env=environment(settings),
        settings=dict(settings, sizes=[list(s) for s in settings['sizes']]),
        memory_note=MEMORY_NOTES[settings['device_type']] +
        (IN_PROCESS_CPU_NOTE
         if settings['device_type'] == 'cpu' and settings['isolate'] == 'none' else ''),
        backbones={
            s['label']: dict(scope=s['scope'], cfg=s['cfg'], source=s['source'])
            for s in specs
        },
        overrides=overrides,
        results=results,
        ratios=compute_ratios(results))
    report = format_report(data)
    os.makedirs(args.out_dir, exist_ok=True)
    stem = osp.join(args.out_dir, OUT_STEM)
    with open(stem + '.md', 'w') as f:
        f.write(report + '\n')
    with open(stem + '.json', 'w') as f:
        json.dump(data, f, indent=1, default=repr)
    if not args.no_plot:
        draw(data, stem + '.png')
    print()
    print(report)
    print(f'\nwritten: {stem}.md, {stem}.json' + ('' if args.no_plot else f', {stem}.png'))
    return 1 if any(r['status'] == 'error' for r in results) else 0


if __name__ == '__main__':
    sys.exit(main())
