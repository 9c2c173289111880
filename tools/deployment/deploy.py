"""mmdeploy's ``tools/deploy.py`` for this project: a model config to an onnxruntime graph.

    python tools/deployment/deploy.py DEPLOY_CFG MODEL_CFG [CHECKPOINT] [IMAGE]
        [--work-dir work_dirs/deploy] [--shape H W] [--check-shapes H W [H W ...]]
        [--box-iou 0.99]

The same arguments as mmdeploy 1.3's ``tools/deploy.py`` (which lives in mmdeploy's
repository, not in its wheel) for the onnxruntime backend (CPU): DEPLOY_CFG is an mmdeploy
deploy config (the project's are in ``tools/deployment/configs``), MODEL_CFG a detector /
segmentor config of the project. Writes ``WORK_DIR/end2end.onnx`` (``onnx_config.save_file``)
with ``polaformer_mm.deployment.export_end2end``, which differs from mmdeploy's ``torch2onnx``
in what stands in the way on current torch:

* the checkpoint is read weights-only through ``polaformer_mm.utils.checkpoint_io`` and must
  fit the model (mmengine's reader, which mmdeploy calls, fails on torch 2.6+ for a plain
  mmengine checkpoint, and loads what fits of another one);
* ``torch.onnx.export`` takes the TorchScript exporter (torch 2.9+ defaults to the dynamo
  exporter, which mmdeploy's rewrites do not support), and mmdeploy's RoIAlign symbolic finds
  the torch API it calls (``polaformer_mm.utils.compat.legacy_onnx_export_api``);
* the project's own rewrites for onnxruntime (``polaformer_mm.deployment.rewrites``:
  adaptive pooling exact at every size, mmdet's RPN and R-CNN post-processing).

Then it runs onnx's checker and compares onnxruntime with PyTorch (``model.predict``) on
IMAGE (default: a random image of ``--shape``) at its size (``--shape``: resized to H x W) and,
for a dynamic deploy config, at ``--check-shapes``; exits with status 1 when a box has no match
at IoU >= ``--box-iou`` or a pixel differs in class.
"""
import argparse
import os
import os.path as osp
import sys
from typing import List, Optional

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..', '..')))
from polaformer_mm import deployment  # noqa: E402
from polaformer_mm.engine.entry import USER_ERRORS  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('deploy_cfg', help='mmdeploy deploy config (onnxruntime backend)')
    parser.add_argument('model_cfg', help='detector / segmentor config')
    parser.add_argument(
        'checkpoint',
        nargs='?',
        default=None,
        help='checkpoint of the model (weights-only loading); without it the '
        'initial weights are exported')
    parser.add_argument(
        'image', nargs='?', default=None, help='image to trace on and to check (default: random)')
    parser.add_argument('--work-dir', default='work_dirs/deploy', help='output folder')
    parser.add_argument(
        '--shape',
        type=int,
        nargs=2,
        default=None,
        metavar=('H', 'W'),
        help='resize the image to H x W (default: its own size; 512 x 512 for a random one)')
    parser.add_argument(
        '--check-shapes',
        type=int,
        nargs='+',
        default=[],
        metavar='HW',
        help='further image sizes to check a dynamic graph at, as H W pairs')
    parser.add_argument(
        '--box-iou', type=float, default=0.99, help='IoU at which two boxes count as the same')
    args = parser.parse_args(argv)
    if len(args.check_shapes) % 2:
        parser.error('--check-shapes takes H W pairs')
    if args.shape is not None and min(args.shape) < 1:
        parser.error(f'--shape must be two positive sizes, got {args.shape[0]} {args.shape[1]}')
    return args


def main(argv: Optional[List[str]] = None) -> dict:
    """Export and check; returns the file, the agreement rows and ``ok``."""
    args = parse_args(argv)
    missing = deployment.mmdeploy_missing()
    if missing:
        raise SystemExit(missing)
    deploy_cfg, dynamic = deployment.load_deploy_config(args.deploy_cfg)
    if args.check_shapes and not dynamic:
        raise SystemExit(f'--check-shapes needs a dynamic deploy config; {args.deploy_cfg} '
                         'is static')
    image = deployment.folder_images(args.image, 1)[0] if args.image else None
    shape = tuple(args.shape or (image.shape[:2] if image is not None else (512, 512)))
    os.makedirs(args.work_dir, exist_ok=True)
    path = osp.join(args.work_dir, deploy_cfg.onnx_config.get('save_file', 'end2end.onnx'))
    export = deployment.export_end2end(
        args.model_cfg,
        args.checkpoint,
        path,
        shape,
        dynamic=dynamic,
        deploy_cfg=deploy_cfg,
        image=image)
    ops = deployment.check_onnx(path)
    print(f'{path}: {type(export.model).__name__} end to end ({export.task}, '
          f'{"dynamic" if dynamic else "static"}), outputs {", ".join(export.output_names)}; '
          f'onnx.checker: ok; {len(ops)} operator types')
    if image is None:
        image = deployment.random_images(1, shape)[0]
    pairs = args.check_shapes
    shapes = [shape] + [(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2)]
    rows = deployment.compare_end2end(export, [image], shapes, iou_threshold=args.box_iou)
    ok = True
    for r in rows:
        where = f'image {r.image[0]}x{r.image[1]} (input {r.shape[0]}x{r.shape[1]})'
        if isinstance(r, deployment.MapAgreement):
            print(f'{where}: {100 * r.agreement:.3f}% of the pixels of the same class as PyTorch')
            ok &= r.agreement == 1
        else:
            print(f'{where}: {r.torch_boxes} boxes in PyTorch, {r.onnx_boxes} in onnxruntime, '
                  f'{100 * r.matched:.1f}% matched at IoU >= {args.box_iou:g} (min IoU '
                  f'{r.iou_min:.4f}), {100 * r.label_agreement:.1f}% same label, scores within '
                  f'{r.score_max_abs:.1e}')
            ok &= r.matched == 1 and r.label_agreement == 1
    print('onnxruntime vs PyTorch: ' + ('same predictions' if ok else 'predictions DIFFER'))
    return {'file': path, 'rows': rows, 'ok': ok}


if __name__ == '__main__':
    try:
        sys.exit(0 if main()['ok'] else 1)
    except USER_ERRORS + (FileNotFoundError, deployment.DeployConfigError) as err:
        sys.exit(f'error: {err}')
