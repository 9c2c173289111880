"""The softmax checkpoint layouts the warm start reads: those every registered backbone
family declares (``BackboneFamily.layouts``, :mod:`polaformer_mm.models.family`), in the
parts of :mod:`polaformer_mm.models.checkpoint_layouts`.
"""
from typing import List, Optional, Sequence, Tuple

from ..backbones.base import POLA_KEYS
from ..checkpoint_layouts import Converted, Layout
from ..family import families, family_named

__all__ = ['Converted', 'Layout', 'POLA_KEYS', 'all_layouts', 'find_layout', 'layouts_of']


def all_layouts() -> List[Layout]:
    """Every layout of every registered family, family by family."""
    return [layout for family in families() for layout in family.layouts]


def find_layout(keys: Sequence[str], family: str) -> Tuple[Optional[Layout], List[Layout]]:
    """The layout of ``family`` that reads ``keys`` (None if there is none), and the
    layouts of other families that recognise them."""
    keys = list(keys)
    for layout in layouts_of(family):
        if layout.detect(keys):
            return layout, []
    return None, [lay for lay in all_layouts() if lay.family != family and lay.detect(keys)]


def layouts_of(family: str) -> List[Layout]:
    """The layouts a family's warm start reads (its own declaration only: the other
    families, whose modules may be imported lazily, are listed for an error alone)."""
    return [lay for lay in family_named(family).layouts if lay.convert is not None]
