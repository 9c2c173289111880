"""ONNX export of Pola backbones and of whole detectors / segmentors, and its checks.

Three exports:

* ``part='backbone'`` (:class:`ExportableModel`, :func:`export_onnx`): the backbone of
  the config's model, images (B, 3, H, W) to its stage maps.
* ``part='model'`` (the same functions): the tensor part of the whole model, plain tensor
  maths only: for a mmseg ``EncoderDecoder`` ``model._forward`` (backbone, neck, decode
  head: the segmentation logits at the head's stride); for a mmdet one-stage detector
  ``model._forward`` (backbone, neck, head: per level the class scores and box deltas,
  then any further head outputs); for a two-stage detector ``extract_feat`` and the RPN
  head's forward (per level objectness and box deltas).
* end to end (:func:`export_end2end`): the whole detector / segmentor with its
  post-processing (anchor decoding, NMS, RoIAlign, the RoI heads; the resized logits'
  argmax), through mmdeploy's rewrites for onnxruntime (mmdet 3.x and mmseg 1.x have no
  ONNX export of their own), with the project's own rewrites where mmdeploy's
  approximate mmdet (:func:`register_mmdeploy_rewrites`). Needs mmdeploy
  (:data:`MMDEPLOY_VERSION`, :data:`MMDEPLOY_INSTALL`); checked against PyTorch's
  predictions by :func:`compare_end2end`.

Every graph takes the model's *preprocessed* input: normalised by the data
preprocessor's mean / std and padded as it pads, as mmdeploy's exported graphs do.

The TorchScript exporter records a trace; under it the Pola modules take their plain
tensor formulations (see :func:`polaformer_mm.utils.compat.in_graph_capture`), so that
every size-dependent step is in the graph and one file serves any input size. The graphs
use the operators of opset 11 (mmdeploy's default).
"""
import os
import os.path as osp
import time
import warnings
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .utils.compat import TORCHSCRIPT_ONNX_EXPORT

if TYPE_CHECKING:
    from mmengine.config import Config

__all__ = [
    'PARTS', 'DEFAULT_OPSET', 'Difference', 'ExportableModel', 'build_exportable', 'build_model',
    'check_onnx', 'compare_onnxruntime', 'export_onnx', 'median_seconds', 'other_shapes',
    'time_end2end', 'time_runs', 'MMDEPLOY_VERSION', 'MMDEPLOY_INSTALL', 'DEPLOY_CONFIGS',
    'BoxAgreement', 'DeployConfigError', 'End2EndExport', 'MapAgreement',
    'adaptive_avg_pool2d_matmul', 'compare_end2end', 'deploy_config_file', 'end2end_task',
    'export_end2end', 'folder_images', 'load_deploy_config', 'match_boxes', 'mmdeploy_missing',
    'preprocess_image', 'random_images', 'register_mmdeploy_rewrites', 'sample_images'
]

#: What :func:`build_exportable` can export.
PARTS = ('backbone', 'model')
#: The opset of the exported graphs: mmdeploy's default; every operator is in it.
DEFAULT_OPSET = 11


def _flatten(outputs) -> Tuple[Tensor, ...]:
    """Nested tuples / lists of tensors -> one flat tuple, in order."""
    if isinstance(outputs, Tensor):
        return (outputs, )
    flat = []
    for item in outputs:
        flat.extend(_flatten(item))
    return tuple(flat)


def _scale_upsample_class():
    """A subclass of mmseg's ``Upsample`` that resizes by its scale factor: mmseg's own
    takes ``int(size * scale_factor)`` in Python, which a trace records as constants
    (the sizes at the export), so that the graph would resize to them at every size
    (onnxruntime then silently returns other values). ``F.interpolate`` with the scale
    factor gives the same sizes (floor of size times factor) and the same values, and
    records the resize as a scale. None without mmseg."""
    try:
        from mmseg.models.utils import Upsample
    except ImportError:
        return None, None

    class ScaleUpsample(Upsample):
        """mmseg's ``Upsample``, resizing by ``scale_factor`` when it has no ``size``."""

        def forward(self, x: Tensor) -> Tensor:
            """Resized ``x``."""
            if self.size:
                return super().forward(x)
            return F.interpolate(
                x, scale_factor=self.scale_factor, mode=self.mode, align_corners=self.align_corners)

    return Upsample, ScaleUpsample


def _traceable_upsampling(model: nn.Module) -> None:
    """Give every mmseg ``Upsample`` of ``model`` the forward of
    :func:`_scale_upsample_class` (the same state and results)."""
    upsample, scale_upsample = _scale_upsample_class()
    if upsample is None:
        return
    for module in model.modules():
        if type(module) is upsample:
            module.__class__ = scale_upsample


class ExportableModel(nn.Module):
    """The part of a built model that :func:`export_onnx` records, as a module from
    one image tensor to a flat tuple of tensors.

    Args:
        model (nn.Module): a built mmdet / mmseg model (or a backbone, with
            ``part='backbone'``).
        part (str): one of :data:`PARTS` (see the module docstring).
    """

    def __init__(self, model: nn.Module, part: str):
        super().__init__()
        if part not in PARTS:
            raise ValueError(f'part must be one of {PARTS}, got {part!r}')
        self.part = part
        if part == 'backbone':
            model = getattr(model, 'backbone', model)
            self.description = f'{type(model).__name__} stage maps'
        elif hasattr(model, 'rpn_head') and hasattr(model, 'roi_head'):
            self.description = (f'{type(model).__name__}: backbone, neck and RPN head '
                                '(objectness, box deltas per level)')
        elif hasattr(model, 'decode_head'):
            self.description = f'{type(model).__name__}: backbone, neck, decode head (logits)'
        elif hasattr(model, 'bbox_head'):
            self.description = (f'{type(model).__name__}: backbone, neck and head (class '
                                'scores, box deltas per level)')
        else:
            raise ValueError(f'{type(model).__name__} is neither a mmdet detector nor a '
                             'mmseg segmentor; export its backbone with part="backbone"')
        _traceable_upsampling(model)
        self.model = model

    def forward(self, images: Tensor) -> Tuple[Tensor, ...]:
        """The outputs of the part, flattened (see the module docstring)."""
        model = self.model
        if self.part == 'backbone':
            return _flatten(model(images))
        if hasattr(model, 'rpn_head') and hasattr(model, 'roi_head'):
            return _flatten(model.rpn_head(model.extract_feat(images)))
        return _flatten(model._forward(images))


def build_model(config: Union[str, 'Config'], checkpoint: Optional[str] = None) -> nn.Module:
    """Build the config's model (mmdet / mmseg / mmpretrain, in its default scope) in eval
    mode, with SyncBN turned into BN, and load ``checkpoint`` into it.

    The checkpoint is read weights-only through
    :func:`polaformer_mm.utils.checkpoint_io.load_checkpoint` and must fit the model
    exactly (:class:`~polaformer_mm.engine.checkpoint_fit.CheckpointMismatchError`
    names the keys otherwise). Without a checkpoint the weights are the model's
    initialisation (pretrained backbone files named by the config are not read): good for
    checking an export, not for predictions.

    Args:
        config (str | Config): config file or loaded config.
        checkpoint (str, optional): checkpoint of the whole model.
    """
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.runner.checkpoint import _load_checkpoint_to_model

    from .engine.checkpoint_fit import (CheckpointMismatchError, checkpoint_state_dict,
                                        describe_mismatch)
    from .engine.entry import load_config, task_of
    from .utils.checkpoint_io import load_checkpoint

    cfg = config if isinstance(config, Config) else load_config(config)
    init_default_scope(task_of(cfg))
    model_cfg = cfg.model.copy()
    backbone_cfg = model_cfg.get('backbone', {})
    if checkpoint is None and isinstance(backbone_cfg, dict):
        backbone_cfg.pop('init_cfg', None)
    model = MODELS.build(model_cfg)
    if checkpoint is None:
        model.init_weights()
    else:
        state = load_checkpoint(checkpoint)
        mismatch = describe_mismatch(model, checkpoint_state_dict(state), checkpoint)
        if mismatch:
            raise CheckpointMismatchError(mismatch)
        _load_checkpoint_to_model(model, state, strict=True)
    return revert_sync_batchnorm(model).eval()


def build_exportable(config: str,
                     checkpoint: Optional[str] = None,
                     part: str = 'model') -> Tuple[ExportableModel, dict]:
    """:func:`build_model` and wrap ``part``.

    Returns:
        tuple: the :class:`ExportableModel` and the config's data preprocessor settings
        (``mean``, ``std``, ``pad_size_divisor``; empty when the config has none).
    """
    from .engine.entry import load_config, task_of

    cfg = load_config(config)
    if task_of(cfg) == 'mmpretrain' and part != 'backbone':
        raise ValueError(f'{config} is a classifier (mmpretrain) config: export its backbone '
                         '(--backbone-only)')
    model = build_model(cfg, checkpoint)
    preprocessor = {
        k: v
        for k, v in (cfg.model.get('data_preprocessor') or {}).items()
        if k in ('mean', 'std', 'pad_size_divisor', 'size_divisor', 'bgr_to_rgb')
    }
    return ExportableModel(model, part).eval(), preprocessor


def export_onnx(module: nn.Module,
                path: str,
                shape: Sequence[int],
                dynamic: bool = True,
                opset: int = DEFAULT_OPSET,
                in_channels: int = 3) -> List[str]:
    """Export ``module`` (one image tensor in, a tuple of tensors out) to ``path`` with
    the TorchScript exporter, traced at a (1, in_channels, H, W) input.

    Args:
        module (nn.Module): e.g. an :class:`ExportableModel`, in eval mode.
        path (str): the .onnx file to write.
        shape (Sequence[int]): (H, W) of the trace input.
        dynamic (bool): batch, height and width of the input (and every output axis
            but the channels) are dynamic; else the graph is fixed to ``shape``.
            Default: True.
        opset (int): ONNX opset. Default: :data:`DEFAULT_OPSET`.
        in_channels (int): image channels. Default: 3.

    Returns:
        list[str]: the output names (``output0``, ``output1``, ...).
    """
    H, W = (int(s) for s in shape)
    if min(H, W) < 1:
        raise ValueError(f'--shape must be two positive sizes, got {tuple(shape)}')
    images = torch.randn(1, in_channels, H, W)
    with torch.no_grad():
        outputs = module(images)
    names = [f'output{i}' for i in range(len(outputs))]
    axes = None
    if dynamic:
        axes = {'input': {0: 'batch', 2: 'height', 3: 'width'}}
        for name, out in zip(names, outputs):
            axes[name] = {d: f'{name}_dim{d}' for d in range(out.dim()) if d != 1}
    folder = osp.dirname(osp.abspath(path))
    if not osp.isdir(folder):
        raise FileNotFoundError(f'output folder does not exist: {folder}')
    with torch.no_grad(), warnings.catch_warnings():
        # the op's argument checks compare traced sizes (TracerWarnings): they check the
        # call at trace time and record nothing; every size the graph uses is recorded
        warnings.filterwarnings(
            'ignore', category=torch.jit.TracerWarning, module=r'polaformer_mm\.ops\.')
        torch.onnx.export(
            module, (images, ),
            path,
            input_names=['input'],
            output_names=names,
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
            **TORCHSCRIPT_ONNX_EXPORT)
    return names


def check_onnx(path: str) -> List[str]:
    """Run onnx's checker on the file (full check, with shape inference); returns the
    sorted operator types of the graph."""
    import onnx
    onnx.checker.check_model(path, full_check=True)
    graph = onnx.load(path, load_external_data=False).graph
    return sorted({node.op_type for node in graph.node})


class Difference(NamedTuple):
    """One output at one input size: onnxruntime against PyTorch eager."""
    shape: Tuple[int, int]  #: (H, W) of the input
    name: str  #: output name
    out_shape: Tuple[int, ...]  #: its shape
    max_abs: float  #: max |onnxruntime - torch|
    max_rel: float  #: max_abs / max |torch| (relative to the output's peak)


def _session(path: str):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3  # no warnings on the dynamic output shapes
    return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])


def compare_onnxruntime(module: nn.Module,
                        path: str,
                        shapes: Sequence[Sequence[int]],
                        in_channels: int = 3,
                        seed: int = 0) -> List[Difference]:
    """Run the file in onnxruntime (CPU) and ``module`` in PyTorch on the same random
    (1, in_channels, H, W) input for every (H, W) of ``shapes``; one
    :class:`Difference` per output and size."""
    session = _session(path)
    names = [o.name for o in session.get_outputs()]
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for H, W in shapes:
        images = torch.randn(1, in_channels, int(H), int(W), generator=generator)
        with torch.no_grad():
            expected = module(images)
        got = session.run(None, {session.get_inputs()[0].name: images.numpy()})
        if len(got) != len(expected):
            raise RuntimeError(f'{path} returns {len(got)} outputs, PyTorch {len(expected)}')
        for name, ref, out in zip(names, expected, got):
            ref = ref.numpy()
            if ref.shape != out.shape:
                raise RuntimeError(f'{path} at input {H}x{W}: output {name} has shape '
                                   f'{out.shape}, PyTorch {ref.shape}')
            diff = float(np.abs(ref - out).max()) if ref.size else 0.
            peak = float(np.abs(ref).max()) if ref.size else 0.
            rows.append(
                Difference((int(H), int(W)), name, tuple(ref.shape), diff,
                           diff / peak if peak > 0 else diff))
    return rows


def other_shapes(shape: Sequence[int]) -> List[Tuple[int, int]]:
    """Two further input sizes for an (H, W) export: one smaller in height and larger
    in width, one the other way round, neither a multiple of 32 (the graph must handle
    padding and odd grids)."""
    H, W = (int(s) for s in shape)
    return [(max(H * 3 // 4, 1) + 5, W * 5 // 4 + 3), (H * 5 // 4 + 7, max(W * 3 // 4, 1) + 1)]


def median_seconds(run, repeats: int = 10, warmup: int = 2) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``run()`` after ``warmup``
    untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def time_runs(module: nn.Module,
              path: str,
              shape: Sequence[int],
              repeats: int = 10,
              warmup: int = 2,
              in_channels: int = 3) -> Dict[str, float]:
    """Median seconds per (1, in_channels, H, W) forward of ``module`` in PyTorch eager
    (no gradients) and of the file in onnxruntime (CPU), on this machine with torch's and
    onnxruntime's default thread counts."""
    session = _session(path)
    images = torch.randn(1, in_channels, *(int(s) for s in shape))
    feed = {session.get_inputs()[0].name: images.numpy()}
    with torch.no_grad():
        torch_s = median_seconds(lambda: module(images), repeats, warmup)
    return {
        'torch': torch_s,
        'onnxruntime': median_seconds(lambda: session.run(None, feed), repeats, warmup)
    }


# --------------------------------------------------------------------------------------
# The whole detector / segmentor, post-processing included: mmdeploy's rewrites
# --------------------------------------------------------------------------------------

#: The mmdeploy release the end-to-end export is written and tested against.
MMDEPLOY_VERSION = '1.3.1'
#: How the project installs it (beside the stack, without its declared dependencies).
MMDEPLOY_INSTALL = 'pip install --no-deps -r requirements/deploy.txt'
#: The project's deploy configs (``tools/deployment/configs``), by task.
DEPLOY_CONFIGS = {
    'detection': 'detection_onnxruntime_dynamic.py',
    'instance-seg': 'instance-seg_onnxruntime_dynamic.py',
    'segmentation': 'segmentation_onnxruntime_dynamic.py',
}


def _pool_matrix(size, out: int, like: Tensor) -> Tensor:
    """(out, size): row i averages the inputs [floor(i size / out), ceil((i + 1) size /
    out)), the bins of adaptive average pooling, from a size the graph computes."""
    rows = torch.arange(out, device=like.device)[:, None]
    cols = torch.arange(size, device=like.device)[None, :]
    start = rows * size // out  # non-negative: ONNX Div truncation is floor here
    end = ((rows + 1) * size + out - 1) // out
    inside = (cols >= start) & (cols < end)
    return inside.to(like.dtype) / (end - start).to(like.dtype)


def adaptive_avg_pool2d_matmul(x: Tensor, output_size) -> Tensor:
    """``F.adaptive_avg_pool2d(x, output_size)`` as two matrix products with the bin
    matrices of the input's size, so that a graph of it pools correctly at every input
    size (mmdeploy replaces adaptive pooling by an ``avg_pool2d`` whose kernel is fixed
    at the export size, which pools other bins already there unless the sizes divide,
    e.g. UperNet's pooling scales 3 and 6 of a 4x4 map)."""
    out_h, out_w = (output_size, output_size) if isinstance(output_size, int) else output_size
    H, W = x.shape[-2:]
    out_h = H if out_h is None else int(out_h)
    out_w = W if out_w is None else int(out_w)
    return _pool_matrix(H, out_h, x) @ x @ _pool_matrix(W, out_w, x).transpose(0, 1)


def _gather_rows(x: Tensor, index: Tensor) -> Tensor:
    """``x`` (B, N, D) at the rows ``index`` (B, K) -> (B, K, D)."""
    return torch.gather(x, 1, index[..., None].expand(-1, -1, x.shape[-1]))


def _nms_within(boxes: Tensor, scores: Tensor, groups: Tensor, num_groups: int,
                iou_threshold: float, score_threshold: float, keep: int):
    """mmdet's ``batched_nms`` in a graph: NMS of ``boxes`` (B, N, 4) with ``scores``
    (B, N) within each group (``groups``: (N, ) or (B, N) ids below ``num_groups``),
    scores above ``score_threshold`` only, then the ``keep`` best. Each score goes into
    its group's column of a (B, N, num_groups) score map, 0 elsewhere, for mmdeploy's
    multi-class NMS (ONNX ``NonMaxSuppression``, which keeps scores above the threshold).

    Returns:
        tuple: dets (B, keep, 5: box, score; rows past the detections zero) and their
        groups (B, keep).
    """
    from mmdeploy.mmcv.ops import multiclass_nms
    hot = groups[..., None] == torch.arange(num_groups, device=scores.device)
    return multiclass_nms(
        boxes,
        scores[..., None] * hot.to(scores.dtype),
        keep,
        iou_threshold=iou_threshold,
        score_threshold=score_threshold,
        pre_top_k=-1,
        keep_top_k=keep)


def _drop_small(boxes: Tensor, scores: Tensor, cfg) -> Tensor:
    """Scores of boxes not wider and higher than ``cfg.min_bbox_size`` set to 0 (mmdet
    drops them; a negative or missing size keeps all)."""
    min_size = cfg.get('min_bbox_size', -1)
    if min_size < 0:
        return scores
    wide = (boxes[..., 2] - boxes[..., 0] > min_size) & (boxes[..., 3] - boxes[..., 1] > min_size)
    return scores * wide.to(scores.dtype)


def _level_maps(head, cls_score: Tensor, bbox_pred: Tensor):
    """One level's head maps -> scores (B, A, C) and box deltas (B, A, 4), per anchor."""
    batch = cls_score.shape[0]
    score = cls_score.permute(0, 2, 3, 1).reshape(batch, -1, head.cls_out_channels)
    score = score.sigmoid() if head.use_sigmoid_cls else score.softmax(-1)[..., :-1]
    delta = bbox_pred.permute(0, 2, 3, 1).reshape(batch, -1, head.bbox_coder.encode_size)
    return score, delta


def rpn_predict_by_feat(self,
                        cls_scores,
                        bbox_preds,
                        score_factors=None,
                        batch_img_metas=None,
                        cfg=None,
                        rescale=False,
                        with_nms=True):
    """mmdet's ``RPNHead`` proposals in a graph (onnxruntime): per level the ``nms_pre``
    best anchors, decoded and clipped to the input, boxes not wider / higher than
    ``min_bbox_size`` dropped, NMS within each level (mmdet's ``batched_nms`` over level
    ids), then the ``max_per_img`` best. Returns (dets (B, K, 5), level ids), as
    mmdeploy's own rewrite, which instead suppresses across levels and drops proposals
    scoring 0.05 or less."""
    cfg = self.test_cfg if cfg is None else cfg
    priors = self.prior_generator.grid_priors([c.shape[-2:] for c in cls_scores],
                                              device=cls_scores[0].device)
    nms_pre = cfg.get('nms_pre', -1)
    boxes, scores, levels = [], [], []
    for level, (cls_score, bbox_pred, prior) in enumerate(zip(cls_scores, bbox_preds, priors)):
        score, delta = _level_maps(self, cls_score, bbox_pred)
        score = score[..., 0]  # the object score (sigmoid, or softmax's foreground)
        prior = prior[None].expand(score.shape[0], -1, -1)
        if nms_pre > 0:
            score, index = score.topk(nms_pre, dim=1)  # mmdeploy's rewrite: k <= the size
            delta, prior = _gather_rows(delta, index), _gather_rows(prior, index)
        boxes.append(
            self.bbox_coder.decode(prior, delta, max_shape=batch_img_metas[0]['img_shape']))
        scores.append(score)
        levels.append(torch.full_like(score[0], level, dtype=torch.long))
    boxes, scores = torch.cat(boxes, 1), torch.cat(scores, 1)
    # every proposal scores > 0 (mmdet keeps all): the threshold 0 only drops the zeros
    return _nms_within(boxes, _drop_small(boxes, scores, cfg), torch.cat(levels), len(cls_scores),
                       cfg.nms.iou_threshold, 0., cfg.max_per_img)


def dense_predict_by_feat(self,
                          cls_scores,
                          bbox_preds,
                          score_factors=None,
                          batch_img_metas=None,
                          cfg=None,
                          rescale=False,
                          with_nms=True):
    """mmdet's one-stage detections (``BaseDenseHead.predict_by_feat`` of a head without
    score factors, e.g. ``RetinaHead``) in a graph (onnxruntime): per level the
    ``nms_pre`` best (anchor, class) pairs scoring above ``score_thr``, decoded and
    clipped to the input, NMS within each class, the ``max_per_img`` best. mmdeploy's own
    rewrite takes the ``nms_pre`` best anchors by their best class instead. Returns
    (dets (B, K, 5), labels)."""
    if score_factors is not None and score_factors[0] is not None:
        raise NotImplementedError(f'{type(self).__name__}: heads with score factors '
                                  '(centerness) have no end-to-end rewrite here')
    cfg = self.test_cfg if cfg is None else cfg
    priors = self.prior_generator.grid_priors([c.shape[-2:] for c in cls_scores],
                                              device=cls_scores[0].device)
    nms_pre, score_thr = cfg.get('nms_pre', -1), cfg.get('score_thr', 0)
    boxes, scores, labels = [], [], []
    for cls_score, bbox_pred, prior in zip(cls_scores, bbox_preds, priors):
        score, delta = _level_maps(self, cls_score, bbox_pred)
        classes = score.shape[-1]
        score = torch.where(score > score_thr, score, score.new_zeros(())).flatten(1)
        if nms_pre > 0:
            score, index = score.topk(nms_pre, dim=1)  # mmdeploy's rewrite: k <= the size
        else:
            index = torch.arange(score.shape[1], device=score.device).expand_as(score)
        anchor = index // classes  # non-negative: ONNX Div truncation is floor here
        prior = prior[anchor]  # (B, K, 4)
        boxes.append(
            self.bbox_coder.decode(
                prior, _gather_rows(delta, anchor), max_shape=batch_img_metas[0]['img_shape']))
        scores.append(score)
        labels.append(index - anchor * classes)
    boxes, scores = torch.cat(boxes, 1), torch.cat(scores, 1)
    return _nms_within(boxes, _drop_small(boxes, scores, cfg), torch.cat(labels, 1),
                       self.num_classes, cfg.nms.iou_threshold, score_thr, cfg.max_per_img)


def bbox_predict_by_feat(self,
                         rois,
                         cls_scores,
                         bbox_preds,
                         batch_img_metas,
                         rcnn_test_cfg=None,
                         rescale=False):
    """mmdet's ``BBoxHead`` detections in a graph (onnxruntime): every (RoI, class)
    pair with its class's own box and score above ``score_thr``, NMS within each class,
    the ``max_per_img`` best (mmdet's ``multiclass_nms``). mmdeploy's own rewrite gives
    every class of a RoI the box of its best class. Returns (dets (B, K, 5), labels)."""
    from mmdet.structures.bbox import get_box_tensor
    if self.custom_cls_channels:
        scores = self.loss_cls.get_activation(cls_scores)
    else:
        scores = F.softmax(cls_scores, dim=-1)
    scores = scores[..., :self.num_classes]
    batch, classes = scores.shape[0], self.num_classes
    boxes = get_box_tensor(
        self.bbox_coder.decode(
            rois[..., 1:], bbox_preds, max_shape=batch_img_metas[0]['img_shape']))
    labels = torch.arange(classes, device=scores.device).expand_as(scores[0])
    if self.reg_class_agnostic:  # one box of the RoI for every class, as mmdet
        boxes = boxes[:, :, None].expand(-1, -1, classes, -1)
    boxes = boxes.reshape(batch, -1, 4)  # (B, N * C, 4): (RoI, class) pairs
    return _nms_within(boxes, scores.reshape(batch, -1), labels.reshape(-1), classes,
                       rcnn_test_cfg.nms.iou_threshold, rcnn_test_cfg.score_thr,
                       rcnn_test_cfg.max_per_img)


_MMDEPLOY_REWRITES = []


def register_mmdeploy_rewrites() -> None:
    """Register the project's mmdeploy rewrites for the onnxruntime backend (once), which
    take precedence over mmdeploy's defaults there:

    * ``F.adaptive_avg_pool2d`` (other than global pooling) by
      :func:`adaptive_avg_pool2d_matmul`, exact at every size, instead of mmdeploy's
      ``avg_pool2d`` with a kernel fixed at the export size;
    * ``RPNHead.predict_by_feat`` by :func:`rpn_predict_by_feat`,
      ``RetinaHead.predict_by_feat`` by :func:`dense_predict_by_feat` and
      ``BBoxHead.predict_by_feat`` by :func:`bbox_predict_by_feat`: the proposals and
      detections mmdet computes, where mmdeploy's rewrites approximate them.

    The Pola modules need none: under an export they take their plain tensor
    formulations (:func:`polaformer_mm.utils.compat.in_graph_capture`).
    """
    if _MMDEPLOY_REWRITES:
        return
    from mmdeploy.core import FUNCTION_REWRITER

    def adaptive_avg_pool2d__onnxruntime(input, output_size):
        """Adaptive average pooling, exact at every input size of the graph."""
        if output_size in (1, (1, 1), [1, 1]):
            return FUNCTION_REWRITER.get_context().origin_func(input, output_size)
        return adaptive_avg_pool2d_matmul(input, output_size)

    for name, rewrite in (
        ('torch.nn.functional.adaptive_avg_pool2d', adaptive_avg_pool2d__onnxruntime),
        ('mmdet.models.dense_heads.rpn_head.RPNHead.predict_by_feat', rpn_predict_by_feat),
        ('mmdet.models.dense_heads.retina_head.RetinaHead.predict_by_feat', dense_predict_by_feat),
        ('mmdet.models.roi_heads.bbox_heads.bbox_head.BBoxHead.predict_by_feat',
         bbox_predict_by_feat),
    ):
        FUNCTION_REWRITER.register_rewriter(func_name=name, backend='onnxruntime')(rewrite)
        _MMDEPLOY_REWRITES.append(name)


def mmdeploy_missing() -> Optional[str]:
    """None when mmdeploy imports; else one line saying why not and how to install it."""
    try:
        import mmdeploy
    except Exception as err:  # noqa: BLE001  (ImportError, or a broken install)
        return (f'the end-to-end export needs mmdeploy {MMDEPLOY_VERSION}, which does not '
                f'import ({type(err).__name__}: {err}); install it with `{MMDEPLOY_INSTALL}`')
    if getattr(mmdeploy, '__version__', None) != MMDEPLOY_VERSION:
        warnings.warn(f'mmdeploy {getattr(mmdeploy, "__version__", "?")} is installed; the '
                      f'end-to-end export is tested with mmdeploy {MMDEPLOY_VERSION}')
    return None


def end2end_task(model: nn.Module) -> str:
    """The deploy task of a built model: 'segmentation' (a mmseg segmentor),
    'instance-seg' (a mmdet detector with a mask head) or 'detection'."""
    if hasattr(model, 'decode_head'):
        return 'segmentation'
    roi_head = getattr(model, 'roi_head', None)
    if roi_head is not None and getattr(roi_head, 'with_mask', False):
        return 'instance-seg'
    if hasattr(model, 'bbox_head') or roi_head is not None:
        return 'detection'
    raise ValueError(f'{type(model).__name__} is neither a mmdet detector nor a mmseg '
                     'segmentor: it has no end-to-end export (export its backbone)')


def deploy_config_file(task: str) -> str:
    """The project's deploy config of ``task`` (a key of :data:`DEPLOY_CONFIGS`), from
    the repository's ``tools/deployment/configs`` or an installed package's copy."""
    name = DEPLOY_CONFIGS[task]
    here = osp.dirname(osp.abspath(__file__))
    for root in (osp.dirname(here), osp.join(here, '.mim')):
        path = osp.join(root, 'tools', 'deployment', 'configs', name)
        if osp.isfile(path):
            return path
    raise FileNotFoundError(f'deploy config {name} not found under tools/deployment/configs')


class DeployConfigError(ValueError):
    """A deploy config that the end-to-end export cannot use (named key and file)."""


def _has_dynamic_size(cfg: 'Config') -> bool:
    onnx_cfg = cfg.onnx_config
    axes = (onnx_cfg.get('dynamic_axes') or {}).get(onnx_cfg['input_names'][0], {})
    return {2, 3} <= set(axes)


def load_deploy_config(deploy_cfg: Union[str, 'Config'],
                       dynamic: Optional[bool] = None) -> Tuple['Config', bool]:
    """Read a deploy config (onnxruntime backend) and fit it to the export.

    Args:
        deploy_cfg (str | Config): the deploy config.
        dynamic (bool, optional): True: a graph of dynamic input size (the config must
            name the input's height and width, axes 2 and 3, in
            ``onnx_config.dynamic_axes``); False: a static graph (the dynamic axes are
            dropped); None: as the config says.

    Returns:
        tuple: the config (a copy) and whether the export is dynamic.
    """
    import copy

    from mmengine.config import Config
    if isinstance(deploy_cfg, Config):
        cfg, name = copy.deepcopy(deploy_cfg), deploy_cfg.filename or 'the deploy config'
    else:
        if not osp.isfile(deploy_cfg):
            raise FileNotFoundError(f'deploy config not found: {deploy_cfg}')
        cfg, name = Config.fromfile(deploy_cfg), deploy_cfg
    missing = [k for k in ('onnx_config', 'codebase_config', 'backend_config') if k not in cfg]
    if missing:
        raise DeployConfigError(f'deploy config {name} has no {", ".join(missing)}')
    backend = cfg.backend_config.get('type')
    if backend != 'onnxruntime':
        raise DeployConfigError(f'deploy config {name}: backend_config.type={backend!r}; the '
                                "project's end-to-end export and its checks are for "
                                "'onnxruntime'")
    if dynamic is None:
        dynamic = _has_dynamic_size(cfg)
    elif dynamic and not _has_dynamic_size(cfg):
        raise DeployConfigError(f'deploy config {name}: onnx_config.dynamic_axes gives the '
                                'input no dynamic height and width (axes 2, 3), which a dynamic '
                                'export needs')
    elif not dynamic:
        cfg.onnx_config.pop('dynamic_axes', None)
    return cfg, dynamic


def preprocess_image(model: nn.Module, image: np.ndarray, shape: Sequence[int]):
    """One BGR uint8 image resized to (H, W) = ``shape`` and run through the model's
    data preprocessor (normalised, padded as it pads): the input of an exported graph.

    Returns:
        tuple: the (1, 3, H', W') input and its data sample, whose ``img_shape`` and
        ``ori_shape`` are the input's (H', W'), as the exported graph sees them (it
        clips boxes to the input and predicts every pixel of it).
    """
    import cv2
    H, W = (int(s) for s in shape)
    resized = cv2.resize(image, (W, H), interpolation=cv2.INTER_LINEAR)
    tensor = torch.from_numpy(np.ascontiguousarray(resized.transpose(2, 0, 1)))
    sample = _data_sample_type(model)(
        metainfo=dict(img_shape=(H, W), ori_shape=(H, W), scale_factor=(1., 1.)))
    with torch.no_grad():
        data = model.data_preprocessor({'inputs': [tensor], 'data_samples': [sample]}, False)
    inputs, sample = data['inputs'], data['data_samples'][0]
    full = tuple(int(s) for s in inputs.shape[2:])
    sample.set_metainfo(dict(img_shape=full, ori_shape=full, pad_shape=full))
    return inputs, sample


def _data_sample_type(model: nn.Module):
    if hasattr(model, 'decode_head'):
        from mmseg.structures import SegDataSample
        return SegDataSample
    from mmdet.structures import DetDataSample
    return DetDataSample


IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp')


def folder_images(path: str, num: int) -> List[np.ndarray]:
    """The first ``num`` images (BGR uint8, by file name) of a folder, or the one image
    file ``path``."""
    import cv2
    if osp.isfile(path):
        files = [path]
    elif osp.isdir(path):
        files = [
            osp.join(path, n) for n in sorted(os.listdir(path))
            if n.lower().endswith(IMAGE_SUFFIXES)
        ][:num]
    else:
        raise FileNotFoundError(f'no image file or folder: {path}')
    images = []
    for name in files:
        image = cv2.imread(name, cv2.IMREAD_COLOR)
        if image is None:
            raise ValueError(f'not an image file: {name}')
        images.append(image)
    if not images:
        raise FileNotFoundError(f'no images ({", ".join(IMAGE_SUFFIXES)}) in {path}')
    return images


def sample_images(cfg: 'Config', num: int, seed: int = 0) -> Tuple[List[np.ndarray], str]:
    """Up to ``num`` images of the config's test set (its dataset's ``data_root`` and
    image prefix, by file name), or, where that folder does not exist or holds no
    images, ``num`` random 64x64 images (which say little about a trained model).

    Returns:
        tuple: the images (BGR uint8) and where they come from (a folder, or 'random').
    """
    dataset = cfg.get('test_dataloader', {}).get('dataset', {})
    while 'dataset' in dataset:  # RepeatDataset, ClassBalancedDataset, ...
        dataset = dataset['dataset']
    prefix = dataset.get('data_prefix', {}) or {}
    folder = osp.join(
        dataset.get('data_root', '') or '',
        prefix.get('img', prefix.get('img_path', '')) or '')
    if folder and osp.isdir(folder):
        try:
            return folder_images(folder, num), folder
        except FileNotFoundError:
            pass
    return random_images(num, seed=seed), 'random'


def random_images(num: int, shape: Sequence[int] = (64, 64), seed: int = 0) -> List[np.ndarray]:
    """``num`` random BGR uint8 images of (H, W) = ``shape``."""
    rng = np.random.RandomState(seed)
    return [rng.randint(0, 256, (*shape, 3), dtype=np.uint8) for _ in range(num)]


class End2EndExport(NamedTuple):
    """An end-to-end ONNX file, with the PyTorch model it was exported from."""
    path: str  #: the .onnx file
    model: nn.Module  #: the PyTorch model (eval mode)
    deploy_cfg: 'Config'  #: the deploy config as used (static or dynamic)
    task: str  #: 'detection', 'instance-seg' or 'segmentation'
    output_names: Tuple[str, ...]  #: the graph's outputs
    dynamic: bool  #: whether the graph takes any input size


def _check_end2end_output(path: str) -> None:
    """Stop before building anything: mmdeploy importable, ``path`` an .onnx file in an
    existing folder."""
    missing = mmdeploy_missing()
    if missing:
        raise ImportError(missing)
    if not path.endswith('.onnx'):
        raise ValueError(f'the output file must end in .onnx, got {path}')
    folder = osp.dirname(osp.abspath(path))
    if not osp.isdir(folder):
        raise FileNotFoundError(f'output folder does not exist: {folder}')


def export_end2end(config: Union[str, 'Config'],
                   checkpoint: Optional[str],
                   path: str,
                   shape: Sequence[int],
                   dynamic: Optional[bool] = True,
                   deploy_cfg: Union[str, 'Config', None] = None,
                   image: Optional[np.ndarray] = None) -> End2EndExport:
    """Export a whole detector / segmentor, post-processing included, with mmdeploy's
    rewrites for the onnxruntime backend (:data:`MMDEPLOY_VERSION`).

    The model is built and loaded by :func:`build_model` (weights-only, exact fit); the
    export runs ``mmdeploy.apis.onnx.export`` (what mmdeploy's ``torch2onnx`` runs) under
    :func:`polaformer_mm.utils.compat.legacy_onnx_export_api` (the TorchScript exporter
    on torch 2.5+; the torch API mmdeploy's symbolics call). The graph takes the
    preprocessed image (:func:`preprocess_image`) and returns, for detectors, ``dets``
    (B, N, 5: boxes x1 y1 x2 y2 in input pixels and scores) and ``labels`` (B, N), plus
    ``masks`` (B, N, M, M mask probabilities in the box; M the mask head's output size:
    28 at mmdet's defaults, 14 in the quickstart) for instance segmentation; for segmentors
    the class map (B, 1, H, W) at the input size.

    Args:
        config (str | Config): the model config.
        checkpoint (str, optional): its checkpoint; None exports the initial weights.
        path (str): the .onnx file to write.
        shape (Sequence[int]): (H, W) of the image the trace runs on (then padded as the
            data preprocessor pads).
        dynamic (bool, optional): dynamic batch, height and width (and detection
            count); False: static at the preprocessed ``shape``; None: as the deploy
            config says. Default: True.
        deploy_cfg (str | Config, optional): mmdeploy deploy config (onnxruntime
            backend); default: the project's for the model's task (:data:`DEPLOY_CONFIGS`).
        image (np.ndarray, optional): BGR image for the trace (resized to ``shape``);
            default: random.
    """
    from .engine.entry import load_config
    from .utils.compat import legacy_onnx_export_api

    _check_end2end_output(path)
    cfg = config if not isinstance(config, str) else load_config(config)
    model = build_model(cfg, checkpoint)
    task = end2end_task(model)
    deploy, dynamic = load_deploy_config(deploy_cfg or deploy_config_file(task), dynamic)
    if image is None:
        image = random_images(1, shape)[0]
    inputs, sample = preprocess_image(model, image, shape)
    if not dynamic:  # mmdeploy's (W, H) of the static graph: the preprocessed size
        deploy.onnx_config.input_shape = [int(inputs.shape[3]), int(inputs.shape[2])]
    _traceable_upsampling(model)
    with legacy_onnx_export_api(), warnings.catch_warnings():
        warnings.filterwarnings('ignore', category=torch.jit.TracerWarning)
        from mmdeploy.apis import build_task_processor
        from mmdeploy.apis.onnx import export
        from mmdeploy.utils import get_backend, get_dynamic_axes, get_onnx_config

        build_task_processor(cfg, deploy, 'cpu')  # registers the codebase's rewrites
        register_mmdeploy_rewrites()
        onnx_cfg = get_onnx_config(deploy)
        names = list(onnx_cfg['input_names']) + list(onnx_cfg['output_names'])
        export(
            model,
            inputs,
            output_path_prefix=path[:-len('.onnx')],
            backend=get_backend(deploy).value,
            input_metas={
                'data_samples': [sample],
                'mode': 'predict'
            },
            context_info={'deploy_cfg': deploy},
            input_names=list(onnx_cfg['input_names']),
            output_names=list(onnx_cfg['output_names']),
            opset_version=onnx_cfg.get('opset_version', DEFAULT_OPSET),
            dynamic_axes=get_dynamic_axes(deploy, names),
            keep_initializers_as_inputs=onnx_cfg.get('keep_initializers_as_inputs', False),
            optimize=False)
    return End2EndExport(path, model, deploy, task, tuple(onnx_cfg['output_names']), dynamic)


class BoxAgreement(NamedTuple):
    """Detections of onnxruntime against PyTorch eager over a set of images at one size.

    PyTorch's boxes are matched one-to-one to onnxruntime's, greedily, same-label pairs
    first and then by IoU."""
    image: Tuple[int, int]  #: (H, W) the images were resized to
    shape: Tuple[int, int]  #: (H, W) of the graph input (the preprocessed image)
    images: int  #: images compared
    torch_boxes: int  #: detections of PyTorch, all images
    onnx_boxes: int  #: detections of onnxruntime, all images
    matched: float  #: pairs with IoU >= the threshold / max(torch_boxes, onnx_boxes)
    iou_min: float  #: smallest IoU of a PyTorch box with its match (0 if unmatched)
    iou_median: float  #: median of the same
    label_agreement: float  #: matched pairs (IoU >= threshold) with the same label
    box_max_abs: float  #: max |box corner difference| (pixels) over matched pairs
    score_max_abs: float  #: max |score difference| over matched pairs


class MapAgreement(NamedTuple):
    """Class maps of onnxruntime against PyTorch eager over a set of images at one size."""
    image: Tuple[int, int]  #: (H, W) the images were resized to
    shape: Tuple[int, int]  #: (H, W) of the graph input (the preprocessed image)
    images: int  #: images compared
    pixels: int  #: pixels compared, all images
    agreement: float  #: fraction of pixels with the same class


def match_boxes(ref_boxes: Tensor, ref_labels: Tensor, boxes: Tensor,
                labels: Tensor) -> Tuple[Tensor, Tensor]:
    """One-to-one matching of ``ref_boxes`` (N, 4) to ``boxes`` (M, 4): greedily, the
    pair with the same label and the highest IoU first, then pairs of different labels.

    Returns:
        tuple: for every reference box the index of its match (-1: none) and the IoU
        with it (0 for none).
    """
    from mmdet.structures.bbox import bbox_overlaps
    n, m = len(ref_boxes), len(boxes)
    index = torch.full((n, ), -1, dtype=torch.long)
    ious = torch.zeros(n)
    if n == 0 or m == 0:
        return index, ious
    overlaps = bbox_overlaps(ref_boxes.float(), boxes.float())
    same = (ref_labels[:, None] == labels[None, :]).float()
    order = torch.argsort((overlaps + 2 * same * (overlaps > 0)).flatten(), descending=True)
    used_ref, used = torch.zeros(n, dtype=torch.bool), torch.zeros(m, dtype=torch.bool)
    for flat in order.tolist():
        i, j = divmod(flat, m)
        if used_ref[i] or used[j] or overlaps[i, j] <= 0:
            continue
        used_ref[i] = used[j] = True
        index[i], ious[i] = j, overlaps[i, j]
    return index, ious


def _session_outputs(session, inputs: Tensor, names: Sequence[str]) -> List[Tensor]:
    """The graph's outputs of these ``names`` (in this order) for ``inputs``."""
    outputs = session.run(list(names), {session.get_inputs()[0].name: inputs.numpy()})
    return [torch.from_numpy(o) for o in outputs]


def compare_end2end(export: End2EndExport,
                    images: Sequence[np.ndarray],
                    shapes: Sequence[Sequence[int]],
                    iou_threshold: float = 0.99) -> List[Union[BoxAgreement, MapAgreement]]:
    """Run the exported file in onnxruntime (CPU) and the model in PyTorch eager
    (``model.predict``, mmdet's / mmseg's own inference, boxes not rescaled) on every
    image resized to every (H, W) of ``shapes``; one agreement row per size."""
    session = _session(export.path)
    model = export.model
    rows = []
    for shape in shapes:
        shape = tuple(int(s) for s in shape)
        if export.task == 'segmentation':
            same = total = 0
            for image in images:
                inputs, sample = preprocess_image(model, image, shape)
                with torch.no_grad():
                    ref = model.predict(inputs, [sample])[0].pred_sem_seg.data[0]
                got = _session_outputs(session, inputs, export.output_names[:1])[0]
                if got.dim() == 4 and got.shape[1] > 1:  # logits (with_argmax=False)
                    got = got.argmax(1)
                got = got.reshape(got.shape[-2:])
                if got.shape != ref.shape:
                    raise RuntimeError(f'{export.path}: class map {tuple(got.shape)}, PyTorch '
                                       f'{tuple(ref.shape)} at input {tuple(inputs.shape)}')
                same += int((got == ref).sum())
                total += ref.numel()
            rows.append(
                MapAgreement(
                    tuple(shape), tuple(inputs.shape[2:]), len(images), total,
                    same / max(total, 1)))
            continue
        per_box, n_ref, n_got, n_matched, n_same, box_diff, score_diff = [], 0, 0, 0, 0, 0., 0.
        for image in images:
            inputs, sample = preprocess_image(model, image, shape)
            with torch.no_grad():
                ref = model.predict(inputs, [sample], rescale=False)[0].pred_instances
            dets, labels = (
                o[0] for o in _session_outputs(session, inputs, export.output_names[:2]))
            keep = dets[:, 4] > 0  # rows past the detections are zero
            dets, labels = dets[keep], labels[keep]
            index, ious = match_boxes(ref.bboxes, ref.labels, dets[:, :4], labels)
            good = ious >= iou_threshold
            per_box.append(ious)
            n_ref, n_got, n_matched = n_ref + len(ref.bboxes), n_got + len(dets), n_matched + int(
                good.sum())
            if good.any():
                pairs = index[good]
                n_same += int((ref.labels[good] == labels[pairs]).sum())
                box_diff = max(box_diff, float((ref.bboxes[good] - dets[pairs, :4]).abs().max()))
                score_diff = max(score_diff, float((ref.scores[good] - dets[pairs, 4]).abs().max()))
        ious = torch.cat(per_box)
        rows.append(
            BoxAgreement(
                tuple(shape), tuple(inputs.shape[2:]), len(images), n_ref, n_got,
                n_matched / max(n_ref, n_got) if max(n_ref, n_got) else 1.,
                float(ious.min()) if len(ious) else 1.,
                float(ious.median()) if len(ious) else 1., n_same / n_matched if n_matched else 1.,
                box_diff, score_diff))
    return rows


def time_end2end(export: End2EndExport,
                 image: np.ndarray,
                 shape: Sequence[int],
                 repeats: int = 10,
                 warmup: int = 2) -> Dict[str, float]:
    """Median seconds per image of the whole model: PyTorch eager ``model.predict`` (no
    gradients; for Mask R-CNN the masks pasted into the input) and the end-to-end file in
    onnxruntime (CPU; masks M x M per detection), on ``image`` resized to ``shape`` and
    preprocessed (preprocessing not timed)."""
    session = _session(export.path)
    inputs, sample = preprocess_image(export.model, image, shape)
    feed = {session.get_inputs()[0].name: inputs.numpy()}
    kwargs = {} if export.task == 'segmentation' else {'rescale': False}
    with torch.no_grad():
        torch_s = median_seconds(lambda: export.model.predict(inputs, [sample], **kwargs), repeats,
                                 warmup)
    return {
        'torch': torch_s,
        'onnxruntime': median_seconds(lambda: session.run(None, feed), repeats, warmup)
    }
