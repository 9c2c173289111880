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
    pola-swin-{t,s,b}   PolaSwin tiny/small/base ('LLSS', the 'L' stages over the whole
                        map; -t/-s as in the Mask R-CNN configs, -b as in
                        configs/pola_swin/upernet_pola-swin-b_*.py)
    swin-{t,s,b}        mmdet SwinTransformer with the sizes of the softmax baselines
                        (configs/pola_swin/mask-rcnn_swin-{t,s}-*.py, upernet_swin-b_*.py)
    pola-pvtv2-b{0,1,2} PolaPVTv2 b0/b1/b2 ('LLLL') as in the Mask R-CNN configs
                        (configs/pola_pvtv2/mask-rcnn_pola-pvtv2-b*_fpn_1x_coco.py)
    pvtv2-b{0,1,2}      mmdet PyramidVisionTransformerV2 of the same sizes
    pola-deit-{s,b}     PolaViT deit-small/base (all 'L'), blocks 2/5/8/11 out as in
                        configs/pola_vit/upernet_pola-deit-*16_8xb2-80k_ade20k-512x512.py
    deit-{s,b}          mmseg VisionTransformer DeiT-S/B as in the softmax baselines
                        (configs/pola_vit/upernet_deit-*16_8xb2-80k_ade20k-512x512.py)

Pretrained weights are never loaded. A measurement runs ``--warmup`` untimed steps,
then ``--repeat`` timed ones and reports their median; ``--rounds N`` measures every
backbone N times over, the backbones taking turns within each round, and reports the
median of all rounds' steps (and the largest peak memory), so that a machine's drift moves
every row alike. ``forward`` is an inference
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

``--memory-limit GIB`` (CPU, fresh processes) caps each measuring process near GIB GiB
of resident memory (an address-space limit): a measurement that would need more fails as
OOM instead of swapping or meeting the kernel's OOM killer, and the report gains a table
of where each backbone stops fitting (the largest input that ran, the smallest that did
not). Give the machine's memory and a ladder of ``--sizes`` to find where a softmax
baseline stops fitting. GIB must be finite, above 0 and at most the machine's memory
(``MemTotal``, or the cgroup's limit where lower): a larger cap would never be reached.

``--amp fp16`` / ``bf16`` (CUDA only) run the forward under ``torch.autocast``;
several values give one column of results each. ``--backbone-cfg KEY=VALUE`` sets a
constructor argument of every backbone that takes it (an error if none does);
``NAME:KEY=VALUE`` sets it for the backbone labelled NAME only. VALUE is a Python
literal (``None``, ``56``, ``'LLSS'``) or else a string.

Outputs (``--out-dir``, made if missing; a folder that cannot be written is an error
before any measurement): ``benchmark_backbone.md`` (the table, the Pola / baseline
ratios and the command), ``benchmark_backbone.json`` and ``benchmark_backbone.png``
(time and memory against pixels per image, log-log, one line per backbone). Pairs for
the ratios: ``pola-X`` with ``X``; for configs, a label with ``pola-`` removed.

Exit status: 1 if a measurement failed for a reason other than memory, or if none ran
(every one out of memory), else 0; bad arguments (an ``--out-dir`` that cannot be written
included) are usage errors (2) before any measurement.

The measurement is :mod:`polaformer_mm.analysis.benchmark` (memory probes:
:mod:`polaformer_mm.analysis.memory`; table and figure:
:mod:`polaformer_mm.analysis.benchmark_report`); isolated measurements run as
``python -m polaformer_mm.analysis.benchmark``.
"""
import argparse
import json
import os
import os.path as osp
import shlex
import sys

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from polaformer_mm.analysis import benchmark  # noqa: E402
from polaformer_mm.analysis.benchmark_report import draw, format_report  # noqa: E402
from polaformer_mm.utils.output_paths import OutputPathError, check_output_dir  # noqa: E402

OUT_STEM = 'benchmark_backbone'


def _add_timing_arguments(p: argparse.ArgumentParser) -> None:
    """--repeat, --warmup and --rounds."""
    p.add_argument(
        '--repeat',
        type=int,
        default=3,
        help='timed steps per measurement; the median is reported (default 3)')
    p.add_argument('--warmup', type=int, default=1, help='untimed steps before them (default 1)')
    p.add_argument(
        '--rounds',
        type=int,
        default=1,
        help='measure every backbone this many times over, the backbones taking turns '
        'within each round, and report the median of all rounds\' timed steps (the peak '
        'memory: the largest); drift of the machine then moves every row alike (default 1)')


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description='Time and peak memory of backbones side by side (Pola vs softmax)',
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='names: ' + ' '.join(benchmark.NAMED))
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
        choices=benchmark.MODES,
        help='forward (inference) and/or train (forward + backward)')
    _add_timing_arguments(p)
    p.add_argument('--device', default='cpu', help="'cpu' or 'cuda[:i]' (default cpu)")
    p.add_argument(
        '--amp',
        nargs='+',
        default=['none'],
        choices=list(benchmark.PRECISIONS),
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
        '--memory-limit',
        type=float,
        default=None,
        metavar='GIB',
        help='CPU, fresh processes: a measurement whose process would hold more than GIB '
        'GiB resident fails as OOM (e.g. the machine\'s memory: where a backbone stops '
        'fitting); a finite number above 0, at most the memory of this machine (or of its '
        'cgroup, if less)')
    p.add_argument(
        '--out-dir',
        default=osp.join('work_dirs', 'benchmark_backbone'),
        help='where the table, JSON and PNG go, made if missing and checked before any '
        'measurement (default work_dirs/benchmark_backbone)')
    p.add_argument('--no-plot', action='store_true', help='skip the PNG')
    return p


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise benchmark.BenchmarkError(message)


def validate(args: argparse.Namespace) -> dict:
    """Check the arguments; returns the parsed settings (raises BenchmarkError)."""
    _require(args.repeat >= 1, f'--repeat must be >= 1, got {args.repeat}')
    _require(args.warmup >= 0, f'--warmup must be >= 0, got {args.warmup}')
    _require(args.rounds >= 1, f'--rounds must be >= 1, got {args.rounds}')
    _require(all(b >= 1 for b in args.batch), f'--batch values must be >= 1, got {args.batch}')
    _require(args.threads is None or args.threads >= 1,
             f'--threads must be >= 1, got {args.threads}')
    _require(args.timeout is None or args.timeout > 0, f'--timeout must be > 0, got {args.timeout}')
    _require(bool(args.backbones or args.config), 'give --backbones and/or --config')
    unknown = [n for n in args.backbones if n not in benchmark.NAMED]
    _require(not unknown, f'--backbones: unknown {unknown}; names: {list(benchmark.NAMED)}')
    missing = [c for c in args.config if not osp.isfile(c)]
    _require(not missing, f'--config: file(s) not found: {missing}')
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        raise benchmark.BenchmarkError(f'--device {args.device!r}: {e}') from None
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
    sizes = list(dict.fromkeys(benchmark.parse_size(s) for s in args.sizes))
    isolate = args.isolate if args.isolate != 'auto' else (
        'process' if device.type == 'cpu' else 'none')
    benchmark.check_memory_limit(args.memory_limit)
    _require(
        args.memory_limit is None or (device.type == 'cpu' and isolate == 'process'),
        '--memory-limit limits the resident memory of a measuring process: it needs '
        f'--device cpu and fresh processes (got --device {args.device}, isolation {isolate})')
    return dict(
        device=str(device),
        device_type=device.type,
        sizes=sizes,
        batches=list(dict.fromkeys(args.batch)),
        modes=list(dict.fromkeys(args.mode)),
        precisions=amp,
        repeat=args.repeat,
        warmup=args.warmup,
        rounds=args.rounds,
        isolate=isolate,
        threads=args.threads,
        timeout=args.timeout,
        memory_limit_gib=args.memory_limit)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = validate(args)
        specs = benchmark.backbone_specs(args.backbones, args.config)
        for spec in specs:  # every type resolves here, before any measurement
            benchmark.backbone_class(spec)
        overrides = benchmark.apply_overrides(specs, args.backbone_cfg)
        check_output_dir('--out-dir', args.out_dir)  # before the measurements, not after
    except (benchmark.BenchmarkError, OutputPathError) as e:
        parser.error(str(e))
    command = 'python ' + shlex.join([osp.relpath(osp.abspath(__file__))]
                                     + list(sys.argv[1:] if argv is None else argv))
    results = benchmark.run_all(specs, settings)
    data = benchmark.benchmark_data(command, specs, settings, overrides, results)
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
    return benchmark.exit_code(results)


if __name__ == '__main__':
    sys.exit(main())
