"""What a warm start loaded, left new and left unused: :class:`WarmStartReport`."""
import re
from collections import Counter, OrderedDict
from typing import Dict, List


def tensor_kind(key: str) -> str:
    """The name of a tensor without its stage / block indices:
    ``'layers.0.blocks.1.attn.power'`` -> ``'attn.power'``."""
    parts = key.split('.')
    digits = [i for i, p in enumerate(parts) if p.isdigit()]
    return '.'.join(parts[digits[-1] + 1:]) if digits else key


def _kinds(keys) -> str:
    counts = Counter(tensor_kind(k) for k in keys)
    return ', '.join(f'{kind} x{n}' if n > 1 else kind for kind, n in sorted(counts.items()))


class WarmStartReport:
    """The result of a warm start of a Pola backbone from a softmax checkpoint.

    Attributes:
        backbone (str): The backbone, e.g. ``"PolaPVT(arch='tiny', attn_types='LLLL')"``.
        source (str): The checkpoint.
        layout (str): The key layout it was read in (e.g. "mmdet's
            PyramidVisionTransformer").
        loaded (OrderedDict): Backbone key -> where its values came from (file keys,
            with the rows and any change of form), for every tensor loaded in full or
            in part.
        partial (OrderedDict): Backbone key -> which of its rows keep their initial
            values, for the tensors loaded in part (the gate rows of the Pola
            projections).
        new (OrderedDict): Backbone key -> why it keeps its initial value.
        unused (OrderedDict): File key -> why nothing of the backbone took it.
    """

    def __init__(self, backbone: str, source: str, layout: str):
        self.backbone = backbone
        self.source = source
        self.layout = layout
        self.loaded: Dict[str, List[str]] = OrderedDict()
        self.partial: Dict[str, str] = OrderedDict()
        self.new: Dict[str, str] = OrderedDict()
        self.unused: Dict[str, str] = OrderedDict()

    def counts(self) -> Dict[str, int]:
        """``loaded`` (in full), ``partial``, ``new`` and ``unused`` tensor counts."""
        return dict(
            loaded=len(self.loaded) - len(self.partial),
            partial=len(self.partial),
            new=len(self.new),
            unused=len(self.unused))

    def summary(self) -> str:
        """One line of counts."""
        c = self.counts()
        return (f'{c["loaded"]} tensors loaded, {c["partial"]} loaded in part, {c["new"]} new; '
                f'{c["unused"]} tensors of the file unused')

    def format(self, limit: int = 6) -> str:
        """The summary, the kinds of new and partly loaded tensors, and the unused file
        tensors grouped by reason (``limit`` names per reason)."""
        lines = [
            f'{self.backbone} warm start from {self.source!r} ({self.layout}): '
            f'{self.summary()}'
        ]
        if self.partial:
            kept = sorted({re.sub(r' \d+:\d+', '', why) for why in self.partial.values()})
            lines.append(f'  loaded in part: {_kinds(self.partial)} ({"; ".join(kept)})')
        if self.new:
            lines.append(f'  new: {_kinds(self.new)}')
        by_reason: Dict[str, List[str]] = OrderedDict()
        for key, why in self.unused.items():
            by_reason.setdefault(why, []).append(key)
        for why, keys in by_reason.items():
            shown = ', '.join(
                keys[:limit]) + (f', ... ({len(keys)} in all)' if len(keys) > limit else '')
            lines.append(f'  unused ({why}): {shown}')
        return '\n'.join(lines)

    def details(self) -> str:
        """One line per backbone tensor (loaded from what, or new and why) and per
        unused file tensor."""
        lines = []
        for key, sources in self.loaded.items():
            rest = f'; {self.partial[key]}' if key in self.partial else ''
            lines.append(f'loaded  {key} <- {"; ".join(sources)}{rest}')
        lines += [f'new     {key} ({why})' for key, why in self.new.items()]
        lines += [f'unused  {key} ({why})' for key, why in self.unused.items()]
        return '\n'.join(lines)
