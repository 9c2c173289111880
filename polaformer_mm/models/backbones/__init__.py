from mmengine.registry import MODELS

from ...utils.lazy_registry import register_lazily
from ..family import register_family_module
from .pola_pvt import PolaPVT
from .pola_pvtv2 import PolaPVTv2
from .pola_swin import PolaSwin

__all__ = ['PolaPVT', 'PolaPVTv2', 'PolaSwin', 'PolaViT']

# PolaViT builds on mmpretrain, which ``import polaformer_mm`` does not import: its
# module is imported, and registers the class, on the first look-up of 'PolaViT'
register_lazily(MODELS, 'PolaViT', f'{__name__}.pola_vit')
register_family_module(f'{__name__}.pola_vit')


def __getattr__(name):
    if name == 'PolaViT':
        from .pola_vit import PolaViT
        return PolaViT
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
