"""onnxruntime (CPU) against PyTorch eager: median seconds per image of exported models.

    python tools/analysis_tools/benchmark_onnx.py CONFIG H W [CONFIG H W ...]
        [--backbone-only] [--repeats 10] [--work-dir DIR]

Every CONFIG is exported as ``tools/deployment/pytorch2onnx.py`` exports it (initial
weights: the speed does not depend on them) and both runtimes are timed on the same
(1, 3, H, W) input on this machine, with their default thread counts. Prints a Markdown
table.
"""
import argparse
import os.path as osp
import sys
import tempfile
from typing import List, Optional

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..', '..')))
# polaformer_mm before anything that imports torchvision: keep this order
# isort: off
import polaformer_mm  # noqa: E402,F401  (registers the backbones; before torchvision)
import torch  # noqa: E402
from polaformer_mm.deployment import build_exportable, export_onnx, time_runs  # noqa: E402
# isort: on


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('runs', nargs='+', help='CONFIG H W, repeated')
    parser.add_argument('--backbone-only', action='store_true', help='time the backbones')
    parser.add_argument('--repeats', type=int, default=10, help='timed runs per model')
    parser.add_argument(
        '--work-dir',
        default=None,
        help='where the .onnx files go '
        '(default: a temporary folder)')
    args = parser.parse_args(argv)
    if len(args.runs) % 3:
        parser.error('runs are CONFIG H W triples')
    return args


def main(argv: Optional[List[str]] = None) -> List[dict]:
    """Time every run; returns one row per run."""
    args = parse_args(argv)
    part = 'backbone' if args.backbone_only else 'model'
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.work_dir or tmp
        for i in range(0, len(args.runs), 3):
            config, H, W = args.runs[i], int(args.runs[i + 1]), int(args.runs[i + 2])
            module, _ = build_exportable(config, None, part)
            path = osp.join(folder, osp.splitext(osp.basename(config))[0] + f'_{part}.onnx')
            export_onnx(module, path, (H, W))
            t = time_runs(module, path, (H, W), repeats=args.repeats)
            rows.append(dict(model=module.description, config=osp.basename(config), H=H, W=W, **t))
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads\n')
    print('| config | exported | input | PyTorch eager (ms) | onnxruntime (ms) | speed-up |')
    print('|---|---|---|---|---|---|')
    for r in rows:
        print(f'| {r["config"]} | {r["model"]} | {r["H"]}x{r["W"]} | {r["torch"] * 1e3:.1f} | '
              f'{r["onnxruntime"] * 1e3:.1f} | {r["torch"] / r["onnxruntime"]:.2f}x |')
    return rows


if __name__ == '__main__':
    main()
