"""Let a CUDA build of torchvision import beside a CPU-only torch.

PyPI's torchvision 0.28.0 is a CUDA build. Beside torch 2.13.0+cpu its C++ extension
cannot load, so the operators it would define do not exist, and ``import torchvision``
dies where ``torchvision/_meta_registrations.py`` registers fake kernels for
``torchvision::nms`` and ``torchvision::qnms`` (``operator torchvision::nms does not
exist``). mmengine's runner, mmdet, mmseg and mmpretrain all import torchvision, so
without this none of them imports on such a machine.

:func:`ensure_torchvision_importable` must run before torchvision is first imported. It
changes nothing when torchvision's extension loads (the normal case on a CUDA machine).
Otherwise it defines the two operator schemas, with a pure-torch CPU kernel for ``nms``
(:func:`nms_cpu`), so that torchvision imports and ``torch.ops.torchvision.nms`` works on
the CPU. torchvision's Python wrappers of its compiled ops (``torchvision.ops.nms``,
``roi_align``, ...) still refuse to run there: they check for the compiled extension
first. mmdet and mmseg use mmcv's compiled ops instead. No installed file is touched.

Two callers run it first: ``import polaformer_mm``, and the start-up hook that
``make install`` puts into the virtualenv (:mod:`.startup_hook`), which runs it when
anything first imports torchvision, so that the import order does not matter there.

This module imports nothing of polaformer_mm (the start-up hook loads it by path).
"""
import glob
import importlib.util
import os.path as osp
import sys
import warnings

import torch

_LIBRARY = None  # keeps the torch.library.Library (and its registrations) alive
_SCHEMA = '(Tensor dets, Tensor scores, float iou_threshold) -> Tensor'
_HOOK_MODULE = '_polaformer_mm_startup'  # the start-up hook's name in site-packages


class TorchvisionOpsWarning(UserWarning):
    """torchvision's compiled ops do not load and the start-up hook is not installed."""


def nms_cpu(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS with the semantics of torchvision's and mmcv's compiled kernels.

    A box is dropped when its IoU with a kept box of higher score is greater than
    ``iou_threshold``. Ties in score keep the input order. A pair of zero-area boxes
    that do not overlap has IoU 0 / 0 (NaN) there, which is not greater than the
    threshold, so both are kept, as those kernels keep them.

    Args:
        dets (Tensor): boxes (N, 4) as x1, y1, x2, y2.
        scores (Tensor): scores (N, ).
        iou_threshold (float): IoU above which the lower-scored box is dropped.

    Returns:
        Tensor: int64 indices of the kept boxes, by decreasing score.
    """
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    order = scores.argsort(descending=True, stable=True)
    keep = []
    while order.numel() > 0:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        inter_w = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest])).clamp(min=0)
        inter_h = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest])).clamp(min=0)
        inter = inter_w * inter_h
        iou = inter / (areas[i] + areas[rest] - inter)
        order = rest[~(iou > iou_threshold)]  # NaN (0 / 0) is kept
    return torch.stack(keep)


def _op_exists(name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def stand_in_active() -> bool:
    """True when this module's stand-in operators are registered."""
    return _LIBRARY is not None


def startup_hook_installed() -> bool:
    """True when the start-up hook of :mod:`.startup_hook` is importable."""
    return _HOOK_MODULE in sys.modules or importlib.util.find_spec(_HOOK_MODULE) is not None


def ensure_torchvision_importable(warn: bool = False) -> bool:
    """Register the stand-in operators when torchvision's own cannot load.

    Args:
        warn (bool): warn (:class:`TorchvisionOpsWarning`, naming the fix) when the
            stand-ins are registered here but the start-up hook is not installed, so
            that importing torchvision (or mmdet, mmseg, mmengine's runner) before
            polaformer_mm fails. Default: False.

    Returns:
        bool: True when the stand-in operators are registered (now or before).
    """
    global _LIBRARY
    if _LIBRARY is not None or 'torchvision' in sys.modules:
        return _LIBRARY is not None
    spec = importlib.util.find_spec('torchvision')
    if spec is None or spec.origin is None or _op_exists('nms'):
        return False
    for lib_path in glob.glob(osp.join(osp.dirname(spec.origin), '_C.*')):
        try:
            torch.ops.load_library(lib_path)
            return False  # the real extension works; torchvision reuses it
        except (OSError, ImportError, RuntimeError):
            pass
    lib = torch.library.Library('torchvision', 'DEF')
    lib.define('nms' + _SCHEMA)
    lib.define('qnms' + _SCHEMA)
    lib.impl('nms', nms_cpu, 'CPU')
    _LIBRARY = lib
    if warn:
        warn_if_hook_missing(stacklevel=3)
    return True


def warn_if_hook_missing(stacklevel: int = 2) -> None:
    """Warn (:class:`TorchvisionOpsWarning`, naming the fix) when the start-up hook is
    not installed.

    Args:
        stacklevel (int): as for :func:`warnings.warn`. Default: 2.
    """
    if not startup_hook_installed():
        warnings.warn(
            "torchvision's compiled ops do not load beside this torch build; "
            'polaformer_mm registered stand-ins for torchvision::nms / qnms, which '
            'only helps when polaformer_mm is imported before torchvision, mmengine.runner, '
            'mmdet or mmseg. To make the import order irrelevant, install the start-up '
            'hook into this environment: python -m polaformer_mm.utils.startup_hook '
            '(`make install` does it), or install a torchvision build that matches torch.',
            TorchvisionOpsWarning,
            stacklevel=stacklevel)
