#!/usr/bin/env python
"""Run a detection or segmentation config of this project on one image.

    python tools/demo/image_demo.py IMAGE CONFIG [--weights CKPT] [--allow-partial]
        [--out-dir DIR] [--device cpu|cuda] [--score-thr 0.3]

The config's ``default_scope`` chooses the inferencer: mmdet's ``DetInferencer`` (boxes,
and masks for instance segmentation) or mmseg's ``MMSegInferencer`` (a class per pixel).
Writes into ``--out-dir`` (default ``outputs/``):

* ``vis/<image name>``: the prediction drawn on the image;
* ``preds/<image stem>.json``: the raw prediction. Detection: ``labels``, ``scores``,
  ``bboxes`` (x1, y1, x2, y2 in image pixels) and, for instance segmentation, ``masks``
  (COCO run-length encoding) of every instance scoring at least ``--score-thr``;
  segmentation: ``sem_seg``, one class index per pixel (H rows of W). Both also hold
  ``classes`` (the names the indices refer to) and ``image_shape`` (H, W).

Class names come from the checkpoint's ``meta.dataset_meta`` when it has them, else from
the config's test dataset. Without ``--weights`` the model keeps its random
initialisation and a warning says so: that checks a config end to end, but the
prediction means nothing. ``--weights`` is a checkpoint of the whole detector /
segmentor (for example one written by ``tools/train.py``; keys of a DDP-saved file may
start with ``module.``), read weights-only; pretrained backbone files named in the config
are not loaded. It must fit the model, by the rule and with the message of
``tools/test.py`` (every key, every shape; a backbone-only file or another architecture
is an error naming the keys and the likely cause). ``--allow-partial`` (config:
``allow_partial_load = True``) loads what fits, and a warning says that the rest of the
model keeps its random initialisation.

An image that cannot be read (an empty file, a truncated JPEG / PNG, not an image) is
an error naming the file and the reason. An image that the config's test pipeline cannot
resize (a side would shrink below one pixel, e.g. 10000 x 10 pixels for a 128-pixel
scale) is an error naming both sizes.
A panoptic config without panopticapi stops at once, naming its install command.
Problems of the input end the command with a one-line message (no traceback).
"""
import argparse
import json
import os
import os.path as osp
import sys
import warnings
from typing import List, Optional

import cv2
import mmcv
import numpy as np
import torch
from mmengine.config import Config
from mmengine.runner.checkpoint import _load_checkpoint_to_model

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import polaformer_mm  # noqa: F401  (registers the backbones)
from polaformer_mm.engine import entry
from polaformer_mm.engine.checkpoint_fit import (check_checkpoint_fits, checkpoint_state_dict,
                                                 describe_mismatch)
from polaformer_mm.engine.entry import load_config, task_of
from polaformer_mm.engine.image_check import image_problem
from polaformer_mm.engine.model_check import check_model_channels
from polaformer_mm.engine.panoptic_api import require_panopticapi
from polaformer_mm.utils.checkpoint_io import load_checkpoint, require_checkpoint

RANDOM_WEIGHTS_WARNING = (
    'No --weights given: the model keeps its RANDOM initialisation, so the prediction '
    'means nothing. Pass --weights CKPT (a checkpoint of the whole model) for a real one.')
PARTIAL_WEIGHTS_WARNING = (
    '--allow-partial: the weights do not fit the model; what does not fit keeps its RANDOM '
    'initialisation, so the prediction may mean little. The mismatch:')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description='Detect or segment one image with a polaformer_mm config')
    p.add_argument('image', help='image file')
    p.add_argument('config', help='detection (mmdet) or segmentation (mmseg) config')
    p.add_argument(
        '--weights',
        help='checkpoint of the whole model; without it the '
        'weights are random (with a warning)')
    p.add_argument(
        '--allow-partial',
        action='store_true',
        help='load --weights that do not fit the model (only what fits; a warning names '
        'the rest); default: such weights are an error. Config key: allow_partial_load')
    p.add_argument('--out-dir', default='outputs', help='output folder (default outputs/)')
    p.add_argument(
        '--device',
        choices=['cpu', 'cuda'],
        default=None,
        help='default: cuda when available, else cpu')
    p.add_argument(
        '--score-thr',
        type=float,
        default=0.3,
        help='detection: keep and draw instances scoring at least this')
    return p.parse_args(argv)


def config_dataset_meta(cfg: Config) -> dict:
    """``classes`` and ``palette`` of the config's test dataset (built without reading
    its annotations), in the current default scope."""
    from mmengine.registry import DATASETS
    dataset_cfg = cfg.test_dataloader.dataset.copy()
    dataset_cfg['lazy_init'] = True
    meta = DATASETS.build(dataset_cfg).metainfo
    if not meta.get('classes'):
        raise KeyError(f'the test dataset of the config ({dataset_cfg["type"]}) names no '
                       'classes: set test_dataloader.dataset.metainfo.classes')
    return {'classes': tuple(meta['classes']), 'palette': meta.get('palette') or 'random'}


class DemoInputError(ValueError):
    """An image or config the demo cannot run on."""


def _banner(text: str) -> None:
    print(f'{"!" * 79}\n{text}\n{"!" * 79}', file=sys.stderr)


class _MetaFromConfig:
    """Mixin for the inferencers: ``weights`` read through
    :func:`~polaformer_mm.utils.checkpoint_io.load_checkpoint` and loaded strictly (as
    ``tools/test.py`` loads; ``allow_partial`` opts out); class names from the checkpoint
    when it has them, else from the config's test dataset (upstream falls back to COCO /
    Cityscapes)."""

    allow_partial = False

    def _init_model(self, cfg, weights, device):
        self._weights = weights
        self._checkpoint = None if weights is None else load_checkpoint(weights, what='weights')
        model = super()._init_model(cfg, None, device)  # the weights are loaded just above
        check_model_channels(model)
        return model

    def _check_fits(self, model, checkpoint) -> None:
        source = f'weights {self._weights!r}'
        if not self.allow_partial:
            check_checkpoint_fits(model, checkpoint, source)
            return
        message = describe_mismatch(model, checkpoint_state_dict(checkpoint), source)
        if message:
            warnings.warn(f'{PARTIAL_WEIGHTS_WARNING} {message}', UserWarning, stacklevel=2)
            _banner(f'{PARTIAL_WEIGHTS_WARNING}\n{message}')

    def _load_weights_to_model(self, model, checkpoint, cfg) -> None:
        checkpoint = self._checkpoint
        if checkpoint is not None:
            self._check_fits(model, checkpoint)
        meta = (checkpoint or {}).get('meta', {})
        if checkpoint is not None and ('dataset_meta' in meta or 'CLASSES' in meta):
            super()._load_weights_to_model(model, checkpoint, cfg)
            return
        if checkpoint is not None:
            _load_checkpoint_to_model(model, checkpoint)
        model.dataset_meta = config_dataset_meta(cfg)


def _resize_size(transform: dict, size):
    """(w, h) after a ``Resize`` transform (mmcv / mmdet / mmseg) with a ``scale``; None
    for other transforms."""
    if str(transform.get('type', '')).split('.')[-1] != 'Resize' or \
            transform.get('scale') is None:
        return None
    scale = transform['scale']
    scale = (scale, scale) if isinstance(scale, int) else tuple(scale)
    return mmcv.rescale_size(size, scale) if transform.get('keep_ratio', False) else scale


def check_image_fits_pipeline(cfg: Config, image_shape, image_path: str) -> None:
    """A :class:`DemoInputError` naming both sizes when a ``Resize`` of the config's test
    pipeline would shrink a side of the image below one pixel (cv2 would fail with
    ``inv_scale_x > 0``)."""
    size = (int(image_shape[1]), int(image_shape[0]))  # (w, h), as the transforms take it
    for transform in cfg.test_dataloader.dataset.pipeline:
        new = _resize_size(transform, size)
        if new is None:
            continue
        if min(new) < 1:
            args = {k: transform[k] for k in ('scale', 'keep_ratio') if k in transform}
            raise DemoInputError(
                f'image {image_path} is {size[0]}x{size[1]} pixels (W x H): the test '
                f'pipeline\'s Resize({", ".join(f"{k}={v}" for k, v in args.items())}) '
                f'makes it {new[0]}x{new[1]}, a side below one pixel; its aspect ratio '
                f'({max(size) / min(size):.0f}:1) is too extreme for this pipeline: crop or '
                'pad the image first')
        size = tuple(int(s) for s in new)


def build_inferencer(cfg: Config,
                     scope: str,
                     weights: Optional[str],
                     device: str,
                     allow_partial: bool = False):
    """mmdet's ``DetInferencer`` or mmseg's ``MMSegInferencer`` for ``cfg`` (its test
    pipeline without annotation loading). ``weights`` must fit the model unless
    ``allow_partial`` (or the config's ``allow_partial_load``) is set."""
    cfg = cfg.copy()
    dataset = cfg.test_dataloader.dataset
    loads = ('LoadAnnotations', 'LoadPanopticAnnotations')
    dataset.pipeline = [t for t in dataset.pipeline if str(t['type']).split('.')[-1] not in loads]
    if scope == 'mmdet':
        from mmdet.apis import DetInferencer

        class Inferencer(_MetaFromConfig, DetInferencer):
            pass
    else:
        from mmseg.apis import MMSegInferencer

        class Inferencer(_MetaFromConfig, MMSegInferencer):
            pass

    Inferencer.allow_partial = bool(allow_partial or cfg.get('allow_partial_load', False))
    inferencer = Inferencer(model=cfg, weights=weights, device=device)
    if scope == 'mmseg':
        # MMSegInferencer gives its visualizer the Cityscapes classes unless told
        meta = inferencer.model.dataset_meta
        palette = meta.get('palette')
        if not palette or palette == 'random':
            rng = np.random.RandomState(42)
            palette = [tuple(int(c) for c in rng.randint(0, 256, 3)) for _ in meta['classes']]
        inferencer.visualizer.set_dataset_meta(list(meta['classes']), list(palette))
    return inferencer


def _jsonable(prediction, scope: str, score_thr: float, classes, image_shape) -> dict:
    out = {'classes': list(classes), 'image_shape': [int(s) for s in image_shape]}
    if scope == 'mmdet':
        keep = [i for i, s in enumerate(prediction['scores']) if s >= score_thr]
        out.update({
            k: [v[i] for i in keep]
            for k, v in prediction.items()
            if isinstance(v, list) and len(v) == len(prediction['scores'])
        })
    else:
        out['sem_seg'] = np.asarray(prediction).astype(int).tolist()
    return out


def main(argv: Optional[List[str]] = None) -> dict:
    """Run the demo; returns the paths it wrote (``vis`` and ``pred``)."""
    args = parse_args(argv)
    if not osp.isfile(args.image):
        raise FileNotFoundError(f'image file not found: {args.image}')
    problem = image_problem(args.image)  # before mmcv.imread, whose errors name no file
    if problem is not None:
        raise DemoInputError(f'image {args.image}: {problem}')
    image = mmcv.imread(args.image)
    if image is None:
        raise DemoInputError(f'{args.image} is not an image file that OpenCV can read')
    cfg = load_config(args.config)
    scope = task_of(cfg)
    if scope not in ('mmdet', 'mmseg'):
        raise DemoInputError(f'{args.config} is a {scope} config; the demo runs detection '
                             '(mmdet) and segmentation (mmseg) configs (evaluate classifiers '
                             'with tools/test.py)')
    require_panopticapi(cfg, demo=True, what=f'the demo of {args.config}')
    check_image_fits_pipeline(cfg, image.shape, args.image)
    if args.weights is not None:
        require_checkpoint(args.weights, 'weights')
    else:
        warnings.warn(RANDOM_WEIGHTS_WARNING, UserWarning, stacklevel=2)
        _banner(RANDOM_WEIGHTS_WARNING)
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if device == 'cuda' and not torch.cuda.is_available():
        raise RuntimeError('--device cuda: torch sees no CUDA device (use --device cpu)')

    inferencer = build_inferencer(cfg, scope, args.weights, device, args.allow_partial)
    call_args = dict(return_vis=True)  # nothing saved by the inferencer itself
    if scope == 'mmdet':
        call_args.update(no_save_vis=True, no_save_pred=True, pred_score_thr=args.score_thr)
    try:
        results = inferencer(args.image, **call_args)
    except cv2.error as err:  # a transform check_image_fits_pipeline does not know
        detail = str(err).strip().splitlines()[-1]
        raise DemoInputError(f'the test pipeline failed on image {args.image} '
                             f'({image.shape[1]}x{image.shape[0]} pixels, W x H): '
                             f'{detail}') from None
    prediction, drawn = results['predictions'], results['visualization']
    if scope == 'mmdet':  # lists, one per image; MMSegInferencer unwraps a single image
        prediction, drawn = prediction[0], drawn[0]

    name = osp.basename(args.image)
    vis_path = osp.join(args.out_dir, 'vis', name)
    pred_path = osp.join(args.out_dir, 'preds', osp.splitext(name)[0] + '.json')
    mmcv.imwrite(mmcv.rgb2bgr(drawn), vis_path)
    os.makedirs(osp.dirname(pred_path), exist_ok=True)
    prediction = _jsonable(prediction, scope, args.score_thr,
                           inferencer.model.dataset_meta['classes'], image.shape[:2])
    with open(pred_path, 'w') as f:
        json.dump(prediction, f)
    print(f'wrote {vis_path} and {pred_path}')
    return {'vis': vis_path, 'pred': pred_path}


if __name__ == '__main__':
    # a named problem of the input (the project's named errors, DemoInputError, a missing
    # file): its message and no traceback (entry.run_tool)
    entry.run_tool(main, 'image_demo.py')
