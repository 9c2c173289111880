"""Key layouts of softmax checkpoints and their conversion to the key layout of a Pola
backbone's softmax twin (the same backbone with every block 'S'): the parts every family
uses to declare the layouts it reads (``BackboneFamily.layouts``).

A :class:`Layout` recognises a file by its keys and renames (and where needed reshapes
or reorders) its tensors; every tensor of the file ends up either under a key of the
twin (with the file key it came from, :attr:`Converted.origin`) or as dropped, with the
reason (:attr:`Converted.dropped`: a classifier head, a buffer the model rebuilds). A
key no rule knows keeps its name, so that the strict load into the twin names it. This
module imports nothing of the package.
"""
import re
from collections import OrderedDict
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from torch import Tensor

__all__ = [
    'Converted', 'Layout', 'Builder', 'matches', 'lacks', 'rule_target', 'identity',
    'classifier_part'
]


class Converted(NamedTuple):
    """A softmax file in the twin's key layout."""
    state_dict: 'OrderedDict[str, Tensor]'  #: twin key -> tensor
    origin: Dict[str, Tuple[str, str]]  #: twin key -> (file key, how it was changed or '')
    dropped: Dict[str, str]  #: file key -> why it has no place in the backbone
    #: twin key -> [(first row, end row, file key)] for a tensor joined from several
    pieces: Dict[str, List[Tuple[int, int, str]]] = {}


class Layout(NamedTuple):
    """One key layout of softmax checkpoints of a family."""
    family: str  #: the family's name (``BackboneFamily.name``)
    name: str  #: e.g. "mmdet's SwinTransformer"
    detect: Callable[[Sequence[str]], bool]  #: whether a file's keys are in this layout
    convert: Callable[[Dict[str, Tensor]], Converted]  #: the file in the twin's layout


class Builder:
    """Collects a :class:`Converted`."""

    def __init__(self):
        self.state_dict, self.origin, self.dropped = OrderedDict(), {}, {}
        self.pieces = {}

    def put(self, key: str, value: Tensor, source: str, how: str = '') -> None:
        """Put ``value`` under the twin key ``key``, from the file key ``source``
        (``how``: what was changed on the way, or ''); two file keys for one twin key
        are an error naming both."""
        if key in self.state_dict:
            raise KeyError(f'file keys {self.origin[key][0]!r} and {source!r} both map '
                           f'to {key!r}')
        self.state_dict[key] = value
        self.origin[key] = (source, how)

    def drop(self, source: str, why: str) -> None:
        """Leave the file key ``source`` out of the backbone, for the reason ``why``."""
        self.dropped[source] = why

    def result(self) -> Converted:
        """What was collected."""
        return Converted(self.state_dict, self.origin, self.dropped, self.pieces)


def matches(keys: Sequence[str], *patterns: str) -> bool:
    """Whether every regex of ``patterns`` matches (``re.match``) one of ``keys``."""
    return all(any(re.match(p, k) for k in keys) for p in patterns)


def lacks(keys: Sequence[str], *patterns: str) -> bool:
    """Whether no regex of ``patterns`` matches any of ``keys``."""
    return not any(re.match(p, k) for p in patterns for k in keys)


def rule_target(key: str, rules) -> Tuple[bool, Optional[str]]:
    """(matched, new key) by the first rule of ``rules`` (official_weights' rule lists)
    whose pattern matches ``key``; a matched rule with no target gives None."""
    for pattern, target in rules:
        match = pattern.match(key)
        if match is not None:
            return True, (target(match) if callable(target) else target)
    return False, None


def identity(state_dict: Dict[str, Tensor]) -> Converted:
    """A file already in the twin's layout."""
    out = Builder()
    for key, value in state_dict.items():
        out.put(key, value, key)
    return out.result()


def classifier_part(key: str) -> str:
    """Why a file key of a classification release has no place in a backbone."""
    if key.startswith(('head.', 'head_dist.')):
        return 'classifier head'
    if key.startswith('norm.'):
        return 'final norm of the classifier'
    if key in ('cls_token', 'dist_token'):
        return 'class token of the classifier'
    return 'not read by the converter'
