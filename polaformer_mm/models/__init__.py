from .attention import PolaLinearAttention
from .backbones import PolaPVT, PolaPVTv2, PolaSwin
from .official_weights import convert_official_checkpoint, convert_official_state_dict
from .warm_start import WarmStartReport, warm_start

__all__ = [
    'PolaLinearAttention', 'PolaPVT', 'PolaPVTv2', 'PolaSwin', 'PolaViT', 'WarmStartReport',
    'convert_official_checkpoint', 'convert_official_state_dict', 'warm_start'
]


def __getattr__(name):
    if name == 'PolaViT':  # imported on first use: it imports mmpretrain
        from .backbones import PolaViT
        return PolaViT
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
