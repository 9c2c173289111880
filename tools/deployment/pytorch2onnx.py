"""Export a Pola backbone or a whole detector / segmentor config to ONNX and check it.

    python tools/deployment/pytorch2onnx.py CONFIG [CHECKPOINT] --shape H W [--dynamic]
        [--backbone-only] [--out FILE] [--opset 11] [--check-shapes H W [H W ...]]
        [--rtol 1e-4]

Exports with torch's TorchScript exporter (see ``polaformer_mm.deployment`` for what is
exported), runs onnx's checker, runs the file in onnxruntime (CPU) at the export size and,
with ``--dynamic``, at two other sizes (or those of ``--check-shapes``), and prints the
max abs / rel difference of every output against PyTorch eager. Exits with status 1 when
an output differs by more than ``--rtol`` relative to its peak.
"""
import argparse
import os.path as osp
import sys
from typing import List, Optional

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..', '..')))
# polaformer_mm before anything that imports torchvision: keep this order
# isort: off
import polaformer_mm  # noqa: E402,F401  (registers the backbones; before torchvision)
from polaformer_mm.deployment import DEFAULT_OPSET, build_exportable, check_onnx  # noqa: E402
from polaformer_mm.deployment import compare_onnxruntime, export_onnx, other_shapes  # noqa: E402
# isort: on


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        'config', help='mmdet / mmseg (or, with --backbone-only, '
        'mmpretrain) config file')
    parser.add_argument(
        'checkpoint',
        nargs='?',
        default=None,
        help='checkpoint of the whole model (weights-only loading); without '
        'it the initial weights are exported')
    parser.add_argument(
        '--shape',
        type=int,
        nargs=2,
        required=True,
        metavar=('H', 'W'),
        help='input height and width of the export')
    parser.add_argument(
        '--dynamic',
        action='store_true',
        help='dynamic batch, height and width (checked at three sizes)')
    parser.add_argument(
        '--backbone-only',
        action='store_true',
        help='export the backbone (stage maps) instead of the whole model')
    parser.add_argument(
        '--out', default=None, help='output file (default: the config name with .onnx, here)')
    parser.add_argument(
        '--opset', type=int, default=DEFAULT_OPSET, help=f'ONNX opset (default: {DEFAULT_OPSET})')
    parser.add_argument(
        '--check-shapes',
        type=int,
        nargs='+',
        default=None,
        metavar='HW',
        help='input sizes to check besides the export size, as H W pairs '
        '(default with --dynamic: two others, see other_shapes)')
    parser.add_argument(
        '--rtol',
        type=float,
        default=1e-4,
        help='largest accepted max abs difference / output peak')
    args = parser.parse_args(argv)
    if args.check_shapes is not None:
        if len(args.check_shapes) % 2:
            parser.error('--check-shapes takes H W pairs')
        if not args.dynamic:
            parser.error('--check-shapes needs --dynamic (a static graph runs at --shape only)')
    return args


def main(argv: Optional[List[str]] = None) -> dict:
    """Export and check; returns the file, the operator types and the differences."""
    args = parse_args(argv)
    part = 'backbone' if args.backbone_only else 'model'
    module, preprocessor = build_exportable(args.config, args.checkpoint, part)
    out = args.out or osp.splitext(osp.basename(
        args.config))[0] + ('_backbone' if args.backbone_only else '') + '.onnx'
    export_onnx(module, out, args.shape, dynamic=args.dynamic, opset=args.opset)
    ops = check_onnx(out)
    print(f'exported {module.description} to {out} (opset {args.opset}, '
          f'{"dynamic" if args.dynamic else "static"} input 1x3x{args.shape[0]}x{args.shape[1]}'
          '); onnx.checker: ok')
    if preprocessor:
        print(f'the graph takes preprocessed images: {preprocessor}')
    shapes = [tuple(args.shape)]
    if args.dynamic:
        if args.check_shapes:
            pairs = args.check_shapes
            shapes += [(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2)]
        else:
            shapes += other_shapes(args.shape)
    rows = compare_onnxruntime(module, out, shapes)
    print(f'{"input":>11}  {"output":<9} {"shape":<22} {"max abs":>9} {"max rel":>9}')
    for r in rows:
        print(f'{r.shape[0]:>5}x{r.shape[1]:<5}  {r.name:<9} {str(r.out_shape):<22} '
              f'{r.max_abs:9.2e} {r.max_rel:9.2e}')
    worst = max(rows, key=lambda r: r.max_rel)
    ok = worst.max_rel <= args.rtol
    print(f'onnxruntime vs PyTorch: worst max rel {worst.max_rel:.2e} ({worst.name} at '
          f'{worst.shape[0]}x{worst.shape[1]}): {"ok" if ok else "FAILED"} (rtol {args.rtol:g})')
    return {'file': out, 'ops': ops, 'rows': rows, 'ok': ok}


if __name__ == '__main__':
    sys.exit(0 if main()['ok'] else 1)
