"""onnxruntime (CPU) against PyTorch eager: median seconds per image of exported models.

    python tools/analysis_tools/benchmark_onnx.py CONFIG H W [CONFIG H W ...]
        [--parts backbone end2end] [--repeats 10] [--warmup 2] [--work-dir DIR]

Every CONFIG is exported as ``tools/deployment/pytorch2onnx.py`` exports it, once per part
of ``--parts`` (initial weights: the speed does not depend on them):

* ``backbone``: the backbone's stage maps (``--backbone-only``);
* ``tensor``: the tensor part of the model, no post-processing (``--tensor-only``);
* ``end2end``: the whole detector / segmentor with its post-processing, through mmdeploy
  (the default export); PyTorch runs ``model.predict`` on the same preprocessed input.

Both runtimes run one (1, 3, H, W) image at a time on this machine, in this one process,
with their default thread counts; the medians of ``--repeats`` timed runs after
``--warmup`` untimed ones are printed as a Markdown table with the PyTorch / onnxruntime
ratio, under a line naming the versions, the threads and the load average (before and
after), which says how quiet the machine was.
"""
import argparse
import os
import os.path as osp
import platform
import sys
import tempfile
from typing import List, Optional

import torch

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..', '..')))
from polaformer_mm import deployment  # noqa: E402

PARTS = ('backbone', 'tensor', 'end2end')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('runs', nargs='+', help='CONFIG H W, repeated')
    parser.add_argument(
        '--parts',
        nargs='+',
        choices=PARTS,
        default=['backbone', 'end2end'],
        help='what to export and time of every config (default: backbone end2end)')
    parser.add_argument('--repeats', type=int, default=10, help='timed runs per model')
    parser.add_argument('--warmup', type=int, default=2, help='untimed runs before them')
    parser.add_argument(
        '--work-dir',
        default=None,
        help='where the .onnx files go '
        '(default: a temporary folder)')
    args = parser.parse_args(argv)
    if len(args.runs) % 3:
        parser.error('runs are CONFIG H W triples')
    for i in range(0, len(args.runs), 3):
        if not (args.runs[i + 1].isdigit() and args.runs[i + 2].isdigit()):
            parser.error(f'runs are CONFIG H W triples: {" ".join(args.runs[i:i + 3])} has no '
                         'integer H W')
    if args.repeats < 1 or args.warmup < 0:
        parser.error('--repeats must be >= 1 and --warmup >= 0')
    return args


def _time(config: str, part: str, shape, folder: str, args) -> dict:
    name = osp.splitext(osp.basename(config))[0]
    path = osp.join(folder, f'{name}_{part}_{shape[0]}x{shape[1]}.onnx')
    if part == 'end2end':
        export = deployment.export_end2end(config, None, path, shape)
        image = deployment.random_images(1, shape)[0]
        times = deployment.time_end2end(export, image, shape, args.repeats, args.warmup)
        what = f'{type(export.model).__name__} end to end ({export.task})'
    else:
        module, _ = deployment.build_exportable(config, None,
                                                'backbone' if part == 'backbone' else 'model')
        deployment.export_onnx(module, path, shape)
        times = deployment.time_runs(module, path, shape, args.repeats, args.warmup)
        what = module.description
    return dict(config=osp.basename(config), part=part, what=what, H=shape[0], W=shape[1], **times)


def format_table(rows: List[dict]) -> str:
    """The Markdown table of the timed rows."""
    lines = [
        '| config | exported | input | PyTorch eager (ms) | onnxruntime (ms) | '
        'PyTorch / onnxruntime |', '|---|---|---|---|---|---|'
    ]
    for r in rows:
        lines.append(f'| {r["config"]} | {r["what"]} | {r["H"]}x{r["W"]} | '
                     f'{r["torch"] * 1e3:.1f} | {r["onnxruntime"] * 1e3:.1f} | '
                     f'{r["torch"] / r["onnxruntime"]:.2f}x |')
    return '\n'.join(lines)


def main(argv: Optional[List[str]] = None) -> List[dict]:
    """Time every run; returns one row per config, size and part."""
    args = parse_args(argv)
    if 'end2end' in args.parts:
        missing = deployment.mmdeploy_missing()
        if missing:
            raise SystemExit(f'{missing}; --parts backbone tensor times the parts without it')
    import onnxruntime
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.work_dir or tmp
        for i in range(0, len(args.runs), 3):
            config, shape = args.runs[i], (int(args.runs[i + 1]), int(args.runs[i + 2]))
            for part in args.parts:
                rows.append(_time(config, part, shape, folder, args))
    load_after = os.getloadavg()
    print(f'torch {torch.__version__} ({torch.get_num_threads()} threads), onnxruntime '
          f'{onnxruntime.__version__}, {os.cpu_count()} CPUs ({platform.processor() or "?"}), '
          f'load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; median of '
          f'{args.repeats} runs after {args.warmup} untimed\n')
    print(format_table(rows))
    return rows


if __name__ == '__main__':
    main()
