"""Warm start of Pola backbones from softmax checkpoints (PVT, Swin, PVTv2, DeiT).

``init_cfg=dict(type='WarmStart', checkpoint=..., prefix=...)`` on a Pola backbone, or
:func:`warm_start` on a built one, or ``tools/model_converters/softmax2pola.py`` for a
file that then loads through ``init_cfg=dict(type='Pretrained', ...)``. How it works:
:mod:`.core`; the file layouts it reads: :mod:`.layouts`; the attention translation:
:mod:`.translate`; what it reports: :mod:`.report`.
"""
from mmengine.model.weight_init import BaseInit
from mmengine.registry import WEIGHT_INITIALIZERS

from ..backbones.base import PolaBackboneBase
from .convert import build_backbone, convert_softmax_checkpoint
from .core import WarmStartError, backbone_family, softmax_twin, warm_start, warm_start_from_cfg
from .layouts import LAYOUTS, Layout
from .report import WarmStartReport

__all__ = [
    'LAYOUTS', 'Layout', 'WarmStartError', 'WarmStartInit', 'WarmStartReport', 'backbone_family',
    'build_backbone', 'convert_softmax_checkpoint', 'softmax_twin', 'warm_start',
    'warm_start_from_cfg'
]


@WEIGHT_INITIALIZERS.register_module(name='WarmStart')
class WarmStartInit(BaseInit):
    """``init_cfg=dict(type='WarmStart', checkpoint=..., prefix=...)`` where mmengine
    applies it itself: on a module that is no Pola backbone (Pola backbones handle the
    entry in their ``init_weights``). Such a use is an error that names the module and,
    when it holds a Pola backbone, where the entry belongs.

    Args:
        checkpoint (str): The softmax checkpoint.
        prefix (str, optional): The prefix of the backbone's keys in it.
    """

    def __init__(self, checkpoint=None, prefix=None, **kwargs):
        super().__init__(**kwargs)
        self.checkpoint = checkpoint
        self.prefix = prefix

    def __call__(self, module) -> None:
        """Warm-start ``module`` if it is a Pola backbone; else a named error."""
        if isinstance(module, PolaBackboneBase):
            warm_start_from_cfg(module, dict(checkpoint=self.checkpoint, prefix=self.prefix))
            return
        inner = next(
            (name for name, m in module.named_modules() if isinstance(m, PolaBackboneBase)), None)
        where = (f"; put it on the Pola backbone's init_cfg (model.{inner}.init_cfg)"
                 if inner else '')
        raise TypeError(f"init_cfg type='WarmStart' warm-starts a Pola backbone (PolaPVT, "
                        f'PolaSwin, PolaPVTv2, PolaViT) from softmax weights; it was set on '
                        f'a {type(module).__name__}{where}')
