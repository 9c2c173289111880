"""PolaFormer (polarity-aware linear attention) backbones for OpenMMLab.

``import polaformer_mm`` (or ``custom_imports=dict(imports=['polaformer_mm'])``)
registers ``PolaPVT``, ``PolaSwin`` and ``PolaLinearAttention`` in mmengine's root
MODELS registry, which mmdet, mmseg and mmpretrain registries all fall back to, and
``PolaRunner`` (the runner of ``tools/train.py`` / ``tools/test.py``, importable from
:mod:`polaformer_mm.engine`) with its hooks in its RUNNERS and HOOKS, so that configs name
them by ``type``.
"""
# registers PolaRunner and its hooks in mmengine's RUNNERS / HOOKS
from . import engine  # noqa: F401
from .models import PolaLinearAttention, PolaPVT, PolaSwin
from .version import __version__

__all__ = ['PolaPVT', 'PolaSwin', 'PolaLinearAttention', '__version__']
