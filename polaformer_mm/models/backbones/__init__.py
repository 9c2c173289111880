from .pola_pvt import PolaPVT
from .pola_swin import PolaSwin

__all__ = ['PolaPVT', 'PolaSwin']
