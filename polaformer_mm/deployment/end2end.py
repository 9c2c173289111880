"""End-to-end export: the whole detector / segmentor with its post-processing (anchor
decoding, NMS, RoIAlign, the RoI heads; the resized logits' argmax), through mmdeploy's
rewrites for onnxruntime (mmdet 3.x and mmseg 1.x have no ONNX export of their own), with
the project's own rewrites where mmdeploy's approximate mmdet
(:mod:`polaformer_mm.deployment.rewrites`). Needs mmdeploy (:data:`MMDEPLOY_VERSION`,
:data:`MMDEPLOY_INSTALL`); checked against PyTorch's predictions by
:func:`polaformer_mm.deployment.checks.compare_end2end`.

Here too: the deploy configs (:data:`DEPLOY_CONFIGS`, :func:`load_deploy_config`), the
graph's input (:func:`preprocess_image`) and the images to trace and check on.
"""
import os
import os.path as osp
import warnings
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn

from ..utils.capture import exportable
from ..utils.graph_forms import graph_forms
from .export import DEFAULT_OPSET, build_model, traceable_upsampling
from .graph_passes import finish_graph_file
from .rewrites import register_mmdeploy_rewrites
from .window_scan import window_attention_scopes

if TYPE_CHECKING:
    from mmengine.config import Config

__all__ = [
    'MMDEPLOY_VERSION', 'MMDEPLOY_INSTALL', 'DEPLOY_CONFIGS', 'IMAGE_SUFFIXES', 'DeployConfigError',
    'End2EndExport', 'deploy_config_file', 'end2end_task', 'export_end2end', 'folder_images',
    'load_deploy_config', 'mmdeploy_missing', 'preprocess_image', 'random_images', 'sample_images'
]

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
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))  # polaformer_mm/
    for root in (osp.dirname(package), osp.join(package, '.mim')):
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


def _mmdeploy_export(model, cfg, deploy, inputs: torch.Tensor, sample, path: str,
                     opset: Optional[int]) -> dict:
    """``mmdeploy.apis.onnx.export`` of ``model`` on ``inputs`` to ``path`` with the
    codebase's and the project's rewrites, under the TorchScript exporter's API and the
    graph-capture switch, with the modules in their graph forms
    (:func:`polaformer_mm.utils.graph_forms.graph_forms`); returns the deploy config's
    ``onnx_config``."""
    from ..utils.compat import legacy_onnx_export_api
    with legacy_onnx_export_api(), warnings.catch_warnings(), exportable(), graph_forms(model):
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
            opset_version=opset or onnx_cfg.get('opset_version', DEFAULT_OPSET),
            dynamic_axes=get_dynamic_axes(deploy, names),
            keep_initializers_as_inputs=onnx_cfg.get('keep_initializers_as_inputs', False),
            optimize=False)
    return onnx_cfg


def export_end2end(config: Union[str, 'Config'],
                   checkpoint: Optional[str],
                   path: str,
                   shape: Sequence[int],
                   dynamic: Optional[bool] = True,
                   deploy_cfg: Union[str, 'Config', None] = None,
                   image: Optional[np.ndarray] = None,
                   opset: Optional[int] = None,
                   block_mlps: bool = True) -> End2EndExport:
    """Export a whole detector / segmentor, post-processing included, with mmdeploy's
    rewrites for the onnxruntime backend (:data:`MMDEPLOY_VERSION`).

    The model is built and loaded by :func:`build_model` (weights-only, exact fit); the
    export runs ``mmdeploy.apis.onnx.export`` (what mmdeploy's ``torch2onnx`` runs) under
    :func:`polaformer_mm.utils.compat.legacy_onnx_export_api` (the TorchScript exporter
    on torch 2.5+; the torch API mmdeploy's symbolics call), with the graph-capture switch
    set (:func:`polaformer_mm.utils.capture.exportable`) and the modules in their graph
    forms (:func:`polaformer_mm.utils.graph_forms.graph_forms`). The graph takes the
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
        opset (int, optional): the graph's opset in place of the deploy config's
            ``onnx_config.opset_version`` (None: the deploy config's).
        block_mlps (bool): then rewrite the graph's transformer MLPs to run over blocks
            of tokens (:func:`~polaformer_mm.deployment.blocked_mlp.block_mlps`: the same
            values, faster in onnxruntime at detection sizes). Default: True.
    """
    from ..engine.entry import load_config

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
    traceable_upsampling(model)
    onnx_cfg = _mmdeploy_export(model, cfg, deploy, inputs, sample, path, opset)
    finish_graph_file(path, block_mlps=block_mlps, window_scopes=window_attention_scopes(model))
    return End2EndExport(path, model, deploy, task, tuple(onnx_cfg['output_names']), dynamic)
