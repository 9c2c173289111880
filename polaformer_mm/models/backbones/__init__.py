from .pola_pvt import PolaPVT
from .pola_swin import PolaSwin
from .pola_vit import PolaViT

__all__ = ['PolaPVT', 'PolaSwin', 'PolaViT']
