from .torchvision_compat import ensure_torchvision_importable

__all__ = ['ensure_torchvision_importable']
