from . import torchvision_compat
from .torchvision_compat import ensure_torchvision_importable

__all__ = ['ensure_torchvision_importable', 'torchvision_compat']
