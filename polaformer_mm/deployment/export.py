"""Tensor export: the backbone's stage maps or the tensor part of a whole model, with
torch's TorchScript exporter alone (no mmdeploy).

* ``part='backbone'`` (:class:`ExportableModel`, :func:`export_onnx`): the backbone of
  the config's model, images (B, 3, H, W) to its stage maps.
* ``part='model'`` (the same functions): the tensor part of the whole model, plain tensor
  maths only: for a mmseg ``EncoderDecoder`` ``model._forward`` (backbone, neck, decode
  head: the segmentation logits at the head's stride); for a mmdet one-stage detector
  ``model._forward`` (backbone, neck, head: per level the class scores and box deltas,
  then any further head outputs); for a two-stage detector ``extract_feat`` and the RPN
  head's forward (per level objectness and box deltas).

:func:`build_model` builds and loads the model for every export, the end-to-end one
(:mod:`polaformer_mm.deployment.end2end`) too.
"""
import contextlib
import copy
import os.path as osp
import warnings
from typing import TYPE_CHECKING, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..utils.capture import exportable
from ..utils.compat import TORCHSCRIPT_ONNX_EXPORT
from ..utils.graph_forms import graph_forms
from .graph_passes import finish_graph_file
from .window_scan import window_attention_scopes

if TYPE_CHECKING:
    from mmengine.config import Config

__all__ = [
    'PARTS', 'DEFAULT_OPSET', 'ExportableModel', 'build_exportable', 'build_model', 'check_onnx',
    'export_onnx', 'traceable_upsampling'
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


def traceable_upsampling(model: nn.Module) -> None:
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
        traceable_upsampling(model)
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

    from ..engine.checkpoint_fit import (CheckpointMismatchError, checkpoint_state_dict,
                                         describe_mismatch)
    from ..engine.entry import load_config, task_of
    from ..utils.checkpoint_io import load_checkpoint

    cfg = config if isinstance(config, Config) else load_config(config)
    init_default_scope(task_of(cfg))
    model_cfg = copy.deepcopy(cfg.model)  # the caller's config stays as it is
    backbone_cfg = model_cfg.get('backbone', {})
    if checkpoint is None:
        # pretrained files named by the config are not read: the backbone's init_cfg, and
        # the `pretrained` keys that mmseg's segmentors and backbones turn into one
        if model_cfg.get('pretrained') is not None:
            model_cfg['pretrained'] = None
        if isinstance(backbone_cfg, dict):
            backbone_cfg.pop('init_cfg', None)
            if backbone_cfg.get('pretrained') is not None:
                backbone_cfg['pretrained'] = None
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
    from ..engine.entry import load_config, task_of

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


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` and every module in it in eval mode inside the block, each given back its
    own training flag after it. (``torch.onnx.export`` of a module in training mode gives it
    back with ``module.train(True)``, which sets every submodule to training: a backbone in
    eval mode inside a wrapper built in training mode came out of an export with its
    stochastic depth and dropout on, and PyTorch then differed from the graph.)"""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, training in flags:
            m.training = training


def export_onnx(module: nn.Module,
                path: str,
                shape: Sequence[int],
                dynamic: bool = True,
                opset: int = DEFAULT_OPSET,
                in_channels: int = 3,
                block_mlps: bool = True) -> List[str]:
    """Export ``module`` (one image tensor in, a tuple of tensors out) to ``path`` with
    the TorchScript exporter, traced at a (1, in_channels, H, W) input, with the
    graph-capture switch set (:func:`polaformer_mm.utils.capture.exportable`) and the
    modules in their graph forms (:func:`polaformer_mm.utils.graph_forms.graph_forms`); then the
    file goes through :func:`~polaformer_mm.deployment.graph_passes.finish_graph_file`
    (with the graph's transformer MLPs over blocks of tokens:
    :func:`~polaformer_mm.deployment.blocked_mlp.block_mlps`).

    Args:
        module (nn.Module): e.g. an :class:`ExportableModel`; recorded in eval mode
            (:func:`evaluating`: every module gets its own training flag back).
        path (str): the .onnx file to write.
        shape (Sequence[int]): (H, W) of the trace input.
        dynamic (bool): batch, height and width of the input (and every output axis
            but the channels) are dynamic; else the graph is fixed to ``shape``.
            Default: True.
        opset (int): ONNX opset. Default: :data:`DEFAULT_OPSET`.
        in_channels (int): image channels. Default: 3.
        block_mlps (bool): rewrite the MLPs to run over blocks of tokens (the same
            values; faster in onnxruntime at detection sizes). Default: True.

    Returns:
        list[str]: the output names (``output0``, ``output1``, ...).
    """
    H, W = (int(s) for s in shape)
    if min(H, W) < 1:
        raise ValueError(f'--shape must be two positive sizes, got {tuple(shape)}')
    images = torch.randn(1, in_channels, H, W)
    with torch.no_grad(), evaluating(module):
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
    with torch.no_grad(), warnings.catch_warnings(), exportable(), graph_forms(module), \
            evaluating(module):
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
    finish_graph_file(path, block_mlps=block_mlps, window_scopes=window_attention_scopes(module))
    return names


def check_onnx(path: str) -> List[str]:
    """Run onnx's checker on the file (full check, with shape inference); returns the
    sorted operator types of the graph, those in the bodies of its ``Scan`` nodes (and
    any other subgraph) included."""
    import onnx
    onnx.checker.check_model(path, full_check=True)
    found, graphs = set(), [onnx.load(path, load_external_data=False).graph]
    while graphs:
        for node in graphs.pop().node:
            found.add(node.op_type)
            graphs.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    return sorted(found)
