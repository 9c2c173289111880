"""Export a whole detector / segmentor, or a part of it, to ONNX and check it against PyTorch.

    python tools/deployment/pytorch2onnx.py CONFIG [CHECKPOINT] --shape H W [--dynamic]
        [--tensor-only | --backbone-only] [--no-block-mlps] [--out FILE]
        [--check-shapes H W [H W ...]]
        [--images DIR] [--num-images 20] [--deploy-cfg FILE] [--opset 11] [--rtol 1e-4]
        [--box-iou 0.99] [--min-box-match 0.99] [--min-pixel-agreement 0.999]

The whole model (default) is exported end to end, post-processing included, with mmdeploy's
rewrites for onnxruntime (``polaformer_mm.deployment.end2end``; mmdet 3.x and mmseg 1.x
have no ONNX export of their own): the graph takes the preprocessed image and returns the
detections (boxes, scores, labels[, masks]) or the class map. The tool runs onnx's checker,
then runs the file in onnxruntime (CPU) and the model in PyTorch eager (``model.predict``) on
the same images -- the config's test images (or ``--images``), resized to the export size and,
with ``--dynamic``, to two other sizes (or those of ``--check-shapes``) -- and prints per size
how far the predictions agree: for detectors the boxes matched one-to-one at IoU >= ``--box-iou``
(min / median IoU, matched fraction, label agreement, largest box-corner and score
difference), for segmentors the fraction of pixels of the same class. It exits with status 1
below ``--min-box-match`` (matched fraction and label agreement) or ``--min-pixel-agreement``.

``--tensor-only`` exports the tensor part of the model with torch's TorchScript exporter
alone (no mmdeploy: see ``polaformer_mm.deployment.export``), ``--backbone-only`` the backbone's
stage maps; both print the max abs / rel difference of every output against PyTorch and exit
with status 1 above ``--rtol``.

Every export then runs the graph's transformer MLPs over blocks of tokens in a ``Scan``
(``polaformer_mm.deployment.blocked_mlp``: the same values, faster in onnxruntime at
detection sizes); ``--no-block-mlps`` writes the graph as traced.
"""
import argparse
import os.path as osp
import sys
from typing import List, Optional

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..', '..')))
from polaformer_mm import deployment  # noqa: E402
from polaformer_mm.engine.entry import USER_ERRORS, load_config  # noqa: E402


def _add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the onnxruntime check after the export: sizes, images, tolerances."""
    parser.add_argument(
        '--check-shapes',
        type=int,
        nargs='+',
        default=None,
        metavar='HW',
        help='image sizes to check besides the export size, as H W pairs '
        '(default with --dynamic: two others, see other_shapes)')
    parser.add_argument(
        '--images',
        default=None,
        help='folder of images for the whole-model check (default: the config\'s test '
        'images; random images where the config\'s folder does not exist)')
    parser.add_argument(
        '--num-images', type=int, default=20, help='images of the whole-model check per size')
    parser.add_argument(
        '--deploy-cfg',
        default=None,
        help='mmdeploy deploy config of the whole-model export (default: the project\'s for '
        'the task, tools/deployment/configs)')
    parser.add_argument(
        '--opset',
        type=int,
        default=deployment.DEFAULT_OPSET,
        help=f'ONNX opset of --tensor-only / --backbone-only (default: '
        f'{deployment.DEFAULT_OPSET}; the whole model takes the deploy config\'s)')
    parser.add_argument(
        '--rtol',
        type=float,
        default=1e-4,
        help='--tensor-only / --backbone-only: largest accepted max abs difference / '
        'output peak')
    parser.add_argument(
        '--box-iou', type=float, default=0.99, help='IoU at which two boxes count as the same')
    parser.add_argument(
        '--min-box-match',
        type=float,
        default=0.99,
        help='smallest accepted fraction of matched boxes and of equal labels')
    parser.add_argument(
        '--min-pixel-agreement',
        type=float,
        default=0.999,
        help='smallest accepted fraction of pixels of the same class')


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
        help='image height and width of the export')
    parser.add_argument(
        '--dynamic',
        action='store_true',
        help='dynamic batch, height and width (checked at three sizes)')
    part = parser.add_mutually_exclusive_group()
    part.add_argument(
        '--tensor-only',
        action='store_true',
        help='export the tensor part of the model (no post-processing; no mmdeploy needed)')
    part.add_argument(
        '--backbone-only',
        action='store_true',
        help='export the backbone (stage maps) instead of the whole model')
    parser.add_argument(
        '--no-block-mlps',
        action='store_true',
        help='write the MLPs as traced, not over blocks of tokens')
    parser.add_argument(
        '--out', default=None, help='output file (default: the config name with .onnx, here)')
    _add_check_arguments(parser)
    args = parser.parse_args(argv)
    if args.check_shapes is not None:
        if len(args.check_shapes) % 2:
            parser.error('--check-shapes takes H W pairs')
        if not args.dynamic:
            parser.error('--check-shapes needs --dynamic (a static graph runs at --shape only)')
    if min(args.shape) < 1:
        parser.error(f'--shape must be two positive sizes, got {args.shape[0]} {args.shape[1]}')
    if args.num_images < 1:
        parser.error('--num-images must be at least 1')
    return args


def _shapes(args) -> list:
    shapes = [tuple(args.shape)]
    if args.dynamic:
        if args.check_shapes:
            pairs = args.check_shapes
            shapes += [(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2)]
        else:
            shapes += deployment.other_shapes(args.shape)
    return shapes


def _export_part(args, out: str) -> dict:
    part = 'backbone' if args.backbone_only else 'model'
    module, preprocessor = deployment.build_exportable(args.config, args.checkpoint, part)
    deployment.export_onnx(
        module,
        out,
        args.shape,
        dynamic=args.dynamic,
        opset=args.opset,
        block_mlps=not args.no_block_mlps)
    ops = deployment.check_onnx(out)
    print(f'exported {module.description} to {out} (opset {args.opset}, '
          f'{"dynamic" if args.dynamic else "static"} input 1x3x{args.shape[0]}x{args.shape[1]}'
          '); onnx.checker: ok')
    if preprocessor:
        print(f'the graph takes preprocessed images: {preprocessor}')
    rows = deployment.compare_onnxruntime(module, out, _shapes(args))
    print(f'{"input":>11}  {"output":<9} {"shape":<22} {"max abs":>9} {"max rel":>9}')
    for r in rows:
        print(f'{r.shape[0]:>5}x{r.shape[1]:<5}  {r.name:<9} {str(r.out_shape):<22} '
              f'{r.max_abs:9.2e} {r.max_rel:9.2e}')
    worst = max(rows, key=lambda r: r.max_rel)
    ok = worst.max_rel <= args.rtol
    print(f'onnxruntime vs PyTorch: worst max rel {worst.max_rel:.2e} ({worst.name} at '
          f'{worst.shape[0]}x{worst.shape[1]}): {"ok" if ok else "FAILED"} (rtol {args.rtol:g})')
    return {'file': out, 'ops': ops, 'rows': rows, 'ok': ok}


def _size(hw) -> str:
    return f'{hw[0]:>5}x{hw[1]:<5}'


def print_agreement(rows: list, args) -> bool:
    """Print the whole-model agreement table; whether every size meets the targets."""
    ok = True
    if isinstance(rows[0], deployment.MapAgreement):
        print(f'{"image":>11} {"input":>11} {"images":>6} {"pixels":>9} {"same class":>11}')
        for r in rows:
            print(f'{_size(r.image)} {_size(r.shape)} {r.images:>6} {r.pixels:>9} '
                  f'{100 * r.agreement:10.3f}%')
            ok &= r.agreement >= args.min_pixel_agreement
        worst = min(r.agreement for r in rows)
        print(f'class maps, onnxruntime vs PyTorch: lowest pixel agreement '
              f'{100 * worst:.3f}%: {"ok" if ok else "FAILED"} '
              f'(target >= {100 * args.min_pixel_agreement:g}%)')
        return ok
    print(f'{"image":>11} {"input":>11} {"images":>6} {"boxes pt/ort":>12} {"matched":>8} '
          f'{"IoU min":>8} '
          f'{"IoU med":>8} {"labels":>7} {"box diff":>9} {"score diff":>10}')
    for r in rows:
        print(f'{_size(r.image)} {_size(r.shape)} {r.images:>6} '
              f'{f"{r.torch_boxes}/{r.onnx_boxes}":>12} {100 * r.matched:7.2f}% {r.iou_min:8.4f} '
              f'{r.iou_median:8.4f} {100 * r.label_agreement:6.2f}% {r.box_max_abs:9.2e} '
              f'{r.score_max_abs:10.2e}')
        ok &= r.matched >= args.min_box_match and r.label_agreement >= args.min_box_match
    print(f'detections, onnxruntime vs PyTorch: lowest matched fraction '
          f'{100 * min(r.matched for r in rows):.2f}% (IoU >= {args.box_iou:g}), lowest label '
          f'agreement {100 * min(r.label_agreement for r in rows):.2f}%: '
          f'{"ok" if ok else "FAILED"} (target >= {100 * args.min_box_match:g}%)')
    if not any(r.torch_boxes for r in rows):
        print('no detections at all: the check says nothing about the boxes (random '
              'images or initial weights?)')
    return ok


def _export_end2end(args, out: str) -> dict:
    missing = deployment.mmdeploy_missing()
    if missing:
        raise SystemExit(f'{missing}; --tensor-only exports the tensor part without it')
    cfg = load_config(args.config)
    if args.images:
        images, source = deployment.folder_images(args.images, args.num_images), args.images
    else:
        images, source = deployment.sample_images(cfg, args.num_images)
    export = deployment.export_end2end(
        cfg,
        args.checkpoint,
        out,
        args.shape,
        dynamic=args.dynamic,
        deploy_cfg=args.deploy_cfg,
        image=images[0],
        block_mlps=not args.no_block_mlps)
    ops = deployment.check_onnx(out)
    print(f'exported {type(export.model).__name__} end to end ({export.task}, mmdeploy '
          f'{deployment.MMDEPLOY_VERSION} rewrites for onnxruntime) to {out}: '
          f'{"dynamic" if args.dynamic else "static"}, outputs {", ".join(export.output_names)}'
          '; onnx.checker: ok')
    custom = [op for op in ops if '::' in op]
    print(f'operators: {len(ops)} types, '
          + (f'custom: {", ".join(custom)}' if custom else 'all standard ONNX'))
    print(f'images: {len(images)} from {source}, resized to each size and preprocessed as '
          'the model\'s data preprocessor does; PyTorch: model.predict on the same input')
    rows = deployment.compare_end2end(export, images, _shapes(args), iou_threshold=args.box_iou)
    ok = print_agreement(rows, args)
    return {'file': out, 'ops': ops, 'rows': rows, 'ok': ok, 'task': export.task}


def main(argv: Optional[List[str]] = None) -> dict:
    """Export and check; returns the file, the operator types, the rows and ``ok``."""
    args = parse_args(argv)
    suffix = '_backbone' if args.backbone_only else ('_tensor' if args.tensor_only else '')
    out = args.out or osp.splitext(osp.basename(args.config))[0] + suffix + '.onnx'
    if args.backbone_only or args.tensor_only:
        return _export_part(args, out)
    return _export_end2end(args, out)


if __name__ == '__main__':
    try:
        sys.exit(0 if main()['ok'] else 1)
    except USER_ERRORS + (FileNotFoundError, deployment.DeployConfigError) as err:
        sys.exit(f'error: {err}')
