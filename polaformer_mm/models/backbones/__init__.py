from mmengine.registry import MODELS

from .pola_pvt import PolaPVT
from .pola_pvtv2 import PolaPVTv2
from .pola_swin import PolaSwin

__all__ = ['PolaPVT', 'PolaPVTv2', 'PolaSwin', 'PolaViT']


def _pola_vit():
    """The PolaViT class; importing it imports mmpretrain, which ``import polaformer_mm``
    does not do (the class registers itself in its place)."""
    from .pola_vit import PolaViT
    return PolaViT


def _build_pola_vit(*args, **kwargs):
    """Builds a PolaViT (``type='PolaViT'``) before its module is imported."""
    return _pola_vit()(*args, **kwargs)


MODELS.register_module('PolaViT', module=_build_pola_vit)


def registered_class(entry):
    """The class behind a ``MODELS`` entry: PolaViT's builder (registered until its
    module is imported) resolves to the PolaViT class; any other entry is itself."""
    return _pola_vit() if entry is _build_pola_vit else entry


def __getattr__(name):
    if name == 'PolaViT':
        return _pola_vit()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
