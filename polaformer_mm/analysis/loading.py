"""A config's model with its weights, and an image as that model receives it.

:func:`build_model` builds the model of a detection (mmdet), segmentation (mmseg) or
classification (mmpretrain) config through the registry of the config's ``default_scope``,
in eval mode, with the weights of a checkpoint (:func:`load_weights`: whole-model, bare
backbone or official PolaFormer files, read weights-only) or the backbone's own seeded
random initialisation. :func:`prepare_image` runs the config's test pipeline (annotation
loading dropped) and the model's data preprocessor on an image, as at test time, and keeps
how original pixel coordinates map into the network input.
"""
import copy
import importlib
import re
import warnings
from typing import NamedTuple, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import init_default_scope

from ..engine.entry import task_of
from ..models.official_weights import (convert_official_state_dict, detect_official_family,
                                       extract_state_dict)
from ..utils.checkpoint_io import load_checkpoint

__all__ = ['Prepared', 'build_model', 'load_weights', 'prepare_image']


def _registry(scope: str, name: str):
    return getattr(importlib.import_module(f'{scope}.registry'), name)


def load_weights(model: nn.Module, path: str, what: str = 'checkpoint') -> dict:
    """Load ``path`` (weights-only) into ``model``; every backbone parameter must be in it.

    Accepts whole-model checkpoints (``state_dict`` with ``backbone.*`` keys, an optional
    ``module.`` prefix), bare backbone state dicts and official PolaFormer checkpoints
    (converted on the fly). Returns the keys that stayed as they were and the unused ones.
    """
    obj = load_checkpoint(path, what=what)  # weights-only; mmengine checkpoints too
    state = extract_state_dict(obj, source=path)
    state = {re.sub(r'^module\.', '', k): v for k, v in state.items()}
    if detect_official_family(state) is not None:
        state = convert_official_state_dict(state, family=getattr(model.backbone, 'family', None))
    elif not any(k.startswith('backbone.') for k in state):
        state = {f'backbone.{k}': v for k, v in state.items()}
    # the output norms (norm0..3) act after the attention: not needed here
    needed = [
        k for k, _ in model.named_parameters()
        if k.startswith('backbone.') and not re.match(r'backbone\.norm\d+\.', k)
    ]
    missing = [k for k in needed if k not in state]
    if missing:
        raise KeyError(f'{what} {path!r} lacks {len(missing)} backbone parameters of '
                       f'the model, e.g. {missing[:5]}')
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        warnings.warn(f'{what} {path!r}: {len(result.unexpected_keys)} keys match no '
                      f'parameter of the model, e.g. {result.unexpected_keys[:5]}')
    return dict(kept=list(result.missing_keys), unused=list(result.unexpected_keys))


def build_model(cfg: Config,
                checkpoint: Optional[str],
                device: str,
                seed: int,
                what: str = 'checkpoint') -> nn.Module:
    """The config's model in eval mode: weights from ``checkpoint``, else the backbone's
    own (seeded) random initialisation. Pretrained files named in the config are not
    read."""
    scope = task_of(cfg)
    init_default_scope(scope)
    model_cfg = copy.deepcopy(cfg.model)
    if model_cfg.get('backbone') is None:
        raise KeyError('the config has no model.backbone')
    if cfg.get('data_preprocessor') is not None:  # top level in mmpretrain configs
        model_cfg.setdefault('data_preprocessor', copy.deepcopy(cfg.data_preprocessor))
    if 'pretrained' in model_cfg:  # mmseg's model-level pretrained
        model_cfg['pretrained'] = None
    model_cfg['backbone'].pop('pretrained', None)
    model_cfg['backbone']['init_cfg'] = None
    torch.manual_seed(seed)
    model = _registry(scope, 'MODELS').build(model_cfg)
    if checkpoint is None:
        model.backbone.init_weights()
    else:
        load_weights(model, checkpoint, what)
    return model.to(device).eval()


class Prepared(NamedTuple):
    """The image as the backbone receives it."""
    inputs: torch.Tensor  #: (1, 3, H_in, W_in), normalised and padded
    image: np.ndarray  #: (h, w, 3) uint8 RGB, the pipeline's image without padding
    ori_hw: Tuple[int, int]  #: the original image's (height, width)
    to_input: Tuple[float, float, float, float]  #: x_in = ax x + bx, y_in = ay y + by


def _test_pipeline(cfg: Config) -> list:
    dataset = cfg.get('test_dataloader', {}).get('dataset', {})
    pipeline = dataset.get('pipeline') or cfg.get('test_pipeline')
    if not pipeline:
        raise KeyError('the config has neither test_dataloader.dataset.pipeline nor '
                       'test_pipeline')
    return [t for t in pipeline if 'LoadAnnotations' not in t['type']]


def prepare_image(cfg: Config, model: nn.Module, image_path: str) -> Prepared:
    """Run the config's test pipeline and the model's data preprocessor on the image;
    track how original pixel coordinates map into the network input (Resize and
    CenterCrop move pixels; Pad adds them at the bottom / right)."""
    scope = task_of(cfg)
    build = _registry(scope, 'TRANSFORMS').build
    results = dict(img_path=image_path, img_id=0, sample_idx=0)
    ax = ay = 1.
    bx = by = 0.
    packed = None
    for transform in map(build, _test_pipeline(cfg)):
        name = type(transform).__name__
        if name.startswith('Pack'):
            packed = transform(results)
            break
        before = results.get('img')
        results = transform(results)
        if results is None or 'img' not in results:
            raise RuntimeError(f'test pipeline transform {name} returned no image')
        if before is None:
            continue
        (bh, bw), (h, w) = before.shape[:2], results['img'].shape[:2]
        if (bh, bw) == (h, w) or 'Pad' in name:
            continue
        if 'Resize' in name or 'Rescale' in name:  # pixel centres scale
            fx, fy = w / bw, h / bh
            ax, bx = ax * fx, (bx + 0.5) * fx - 0.5
            ay, by = ay * fy, (by + 0.5) * fy - 0.5
        elif name == 'CenterCrop':  # mmcv's rounding
            bx -= max(0, int(round((bw - w) / 2.)))
            by -= max(0, int(round((bh - h) / 2.)))
        else:
            raise ValueError(f'test pipeline transform {name} changes the image size in '
                             'a way this tool cannot map points through (it follows '
                             'Resize, CenterCrop and Pad)')
    if packed is None:
        raise KeyError('the test pipeline ends without a Pack* transform')
    data = model.data_preprocessor(
        dict(inputs=[packed['inputs']], data_samples=[packed['data_samples']]), False)
    h, w = results['img_shape'][:2]
    image = np.ascontiguousarray(results['img'][:h, :w, ::-1])  # BGR -> RGB
    ori_hw = tuple(int(s) for s in results['ori_shape'][:2])
    return Prepared(data['inputs'], image, ori_hw, (ax, bx, ay, by))
