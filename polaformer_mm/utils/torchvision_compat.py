"""Let a CUDA build of torchvision import beside a CPU-only torch.

PyPI's torchvision 0.28.0 is a CUDA build. Beside torch 2.13.0+cpu its C++ extension
cannot load, so the operators it would define do not exist, and ``import torchvision``
dies where ``torchvision/_meta_registrations.py`` registers fake kernels for
``torchvision::nms`` and ``torchvision::qnms``. mmpretrain imports torchvision at module
level, so without this nothing of mmpretrain imports on such a machine.

:func:`ensure_torchvision_importable` runs before torchvision is first imported. It
changes nothing when torchvision's extension loads (the normal case on a CUDA machine).
Otherwise it defines the two operator schemas, with a pure-torch CPU kernel for ``nms``,
so torchvision imports and ``torchvision.ops.nms`` works on the CPU. No installed file is
touched.
"""
import glob
import importlib.util
import os.path as osp
import sys

import torch

_LIBRARY = None  # keeps the torch.library.Library (and its registrations) alive
_SCHEMA = '(Tensor dets, Tensor scores, float iou_threshold) -> Tensor'


def nms_cpu(dets: torch.Tensor, scores: torch.Tensor,
            iou_threshold: float) -> torch.Tensor:
    """Greedy NMS (torchvision semantics: drop boxes with IoU > threshold)."""
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
        inter_w = (torch.minimum(x2[i], x2[rest]) -
                   torch.maximum(x1[i], x1[rest])).clamp(min=0)
        inter_h = (torch.minimum(y2[i], y2[rest]) -
                   torch.maximum(y1[i], y1[rest])).clamp(min=0)
        inter = inter_w * inter_h
        iou = inter / (areas[i] + areas[rest] - inter)
        order = rest[iou <= iou_threshold]
    return torch.stack(keep)


def _op_exists(name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def ensure_torchvision_importable() -> bool:
    """Returns True when the stand-in operators were registered."""
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
    return True
