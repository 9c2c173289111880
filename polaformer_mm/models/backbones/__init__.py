from .pola_pvt import PolaPVT
from .pola_pvtv2 import PolaPVTv2
from .pola_swin import PolaSwin

__all__ = ['PolaPVT', 'PolaPVTv2', 'PolaSwin']
