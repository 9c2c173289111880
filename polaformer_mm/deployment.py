"""ONNX export of Pola backbones and of the tensor part of whole detectors / segmentors.

What is exported (``part``):

* ``'backbone'``: the backbone of the config's model, images (B, 3, H, W) to its stage
  maps.
* ``'model'``: the tensor forward of the whole model, the part of it that is plain tensor
  maths: for a mmseg ``EncoderDecoder`` ``model._forward`` (backbone, neck, decode head:
  the segmentation logits at 1/4 or the head's stride); for a mmdet one-stage detector
  ``model._forward`` (backbone, neck, head: per level the class scores and box deltas,
  then any further head outputs); for a two-stage detector ``extract_feat`` and the RPN
  head's forward (per level objectness and box deltas). Anchor decoding, NMS, the RoI
  heads (RoIAlign) and the resizing of the results to the image run outside the graph:
  they need mmcv's compiled ops, which onnxruntime does not have (mmdeploy ships them as
  its own onnxruntime custom-op library).

The graph takes the model's *preprocessed* input: normalised by the data preprocessor's
mean / std and padded as it pads, as mmdeploy's exported graphs do.

The TorchScript exporter records a trace; under it the Pola modules take their plain
tensor formulations (see :func:`polaformer_mm.utils.compat.in_graph_capture`), so that
every size-dependent step is in the graph and one file serves any input size. The graph
uses the operators of opset 11 (mmdeploy's default).
"""
import os.path as osp
import time
import warnings
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .utils.compat import TORCHSCRIPT_ONNX_EXPORT

__all__ = [
    'PARTS', 'DEFAULT_OPSET', 'Difference', 'ExportableModel', 'build_exportable', 'check_onnx',
    'compare_onnxruntime', 'export_onnx', 'other_shapes', 'time_runs'
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


def build_exportable(config: str,
                     checkpoint: Optional[str] = None,
                     part: str = 'model') -> Tuple[ExportableModel, dict]:
    """Build the config's model in eval mode, load ``checkpoint`` (weights-only, through
    :func:`polaformer_mm.utils.checkpoint_io.load_checkpoint`) and wrap ``part``.

    Without a checkpoint the weights are the model's initialisation (pretrained backbone
    files named by the config are not read): good for checking the export, not for
    predictions.

    Returns:
        tuple: the :class:`ExportableModel` and the config's data preprocessor settings
        (``mean``, ``std``, ``pad_size_divisor``; empty when the config has none).
    """
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.runner.checkpoint import _load_checkpoint_to_model

    from .engine.entry import load_config, task_of
    from .utils.checkpoint_io import load_checkpoint

    cfg = load_config(config)
    scope = task_of(cfg)
    if scope == 'mmpretrain' and part != 'backbone':
        raise ValueError(f'{config} is a classifier (mmpretrain) config: export its backbone '
                         '(--backbone-only)')
    init_default_scope(scope)
    model_cfg = cfg.model.copy()
    backbone_cfg = model_cfg.get('backbone', {})
    if checkpoint is None and isinstance(backbone_cfg, dict):
        backbone_cfg.pop('init_cfg', None)
    model = MODELS.build(model_cfg)
    if checkpoint is None:
        model.init_weights()
    else:
        _load_checkpoint_to_model(model, load_checkpoint(checkpoint), strict=True)
    model.eval()
    preprocessor = {
        k: v
        for k, v in (model_cfg.get('data_preprocessor') or {}).items()
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

    def median(run) -> float:
        for _ in range(warmup):
            run()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    with torch.no_grad():
        torch_s = median(lambda: module(images))
    return {'torch': torch_s, 'onnxruntime': median(lambda: session.run(None, feed))}
