from .pola_pvt import PolaPVT
from .pola_pvtv2 import PolaPVTv2
from .pola_swin import PolaSwin
from .pola_vit import PolaViT

__all__ = ['PolaPVT', 'PolaPVTv2', 'PolaSwin', 'PolaViT']
