"""Warm start of Pola backbones from softmax checkpoints (of every registered family:
:mod:`polaformer_mm.models.family`).

``init_cfg=dict(type='WarmStart', checkpoint=..., prefix=...)`` on a Pola backbone, or
:func:`warm_start` on a built one, or ``tools/model_converters/softmax2pola.py`` for a
file that then loads through ``init_cfg=dict(type='Pretrained', ...)``. How it works:
:mod:`.core`; the file layouts it reads: :mod:`.layouts`; the attention translation:
:mod:`.translate`; what it reports: :mod:`.report`.
"""
from mmengine.model.weight_init import BaseInit
from mmengine.registry import WEIGHT_INITIALIZERS

from ..backbones.base import PolaBackboneBase
from ..family import families
from .convert import build_backbone, convert_softmax_checkpoint
from .core import WarmStartError, backbone_family, softmax_twin, warm_start, warm_start_from_cfg
from .layouts import Layout, all_layouts
from .report import WarmStartReport

__all__ = [
    'Layout', 'all_layouts', 'WarmStartError', 'WarmStartInit', 'WarmStartReport',
    'backbone_family', 'build_backbone', 'convert_softmax_checkpoint', 'softmax_twin', 'warm_start',
    'warm_start_from_cfg'
]


@WEIGHT_INITIALIZERS.register_module(name='WarmStart')
class WarmStartInit(BaseInit):
    """``init_cfg=dict(type='WarmStart', checkpoint=..., prefix=...)``: warm-starts a Pola
    backbone (whose ``init_weights`` builds this initializer, as mmengine does for a
    module it initialises) and leaves the report on it as ``warm_start_report``: what was
    loaded, what is new, what was left unused (also logged). On a module that is no Pola
    backbone it is an error that names the module and, when it holds a Pola backbone,
    where the entry belongs.

    Args:
        checkpoint (str): The softmax checkpoint.
        prefix (str, optional): The prefix of the backbone's keys in it.
        Other keys are an error that names them.
    """

    def __init__(self, **cfg):
        super().__init__()
        self.cfg = cfg

    def __call__(self, module) -> None:
        """Warm-start ``module`` if it is a Pola backbone; else a named error."""
        if isinstance(module, PolaBackboneBase):
            module.warm_start_report = warm_start_from_cfg(module, self.cfg)
            module._is_init = True
            return
        inner = next(
            (name for name, m in module.named_modules() if isinstance(m, PolaBackboneBase)), None)
        where = (f"; put it on the Pola backbone's init_cfg (model.{inner}.init_cfg)"
                 if inner else '')
        known = ', '.join(family.backbone.__name__ for family in families())
        raise TypeError(f"init_cfg type='WarmStart' warm-starts a Pola backbone ({known}) "
                        f'from softmax weights; it was set on a {type(module).__name__}{where}')
