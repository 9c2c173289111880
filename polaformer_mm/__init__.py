"""PolaFormer (polarity-aware linear attention) backbones for OpenMMLab.

``import polaformer_mm`` (or ``custom_imports=dict(imports=['polaformer_mm'])``)
registers ``PolaPVT``, ``PolaSwin`` and ``PolaLinearAttention`` in mmengine's root
MODELS registry, which mmdet, mmseg and mmpretrain registries all fall back to.
"""
from .utils.torchvision_compat import ensure_torchvision_importable

ensure_torchvision_importable()  # before anything imports torchvision

from .models import PolaLinearAttention, PolaPVT, PolaSwin  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = ['PolaLinearAttention', 'PolaPVT', 'PolaSwin', '__version__']
