from .attention import PolaLinearAttention
from .backbones import PolaPVT, PolaPVTv2, PolaSwin, PolaViT
from .official_weights import convert_official_checkpoint, convert_official_state_dict

__all__ = [
    'PolaLinearAttention', 'PolaPVT', 'PolaPVTv2', 'PolaSwin', 'PolaViT',
    'convert_official_checkpoint', 'convert_official_state_dict'
]
