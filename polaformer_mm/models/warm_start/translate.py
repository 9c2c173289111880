"""One softmax attention into one :class:`~polaformer_mm.models.PolaLinearAttention`.

The query, key and value projections of the softmax attention become the q, k and v
rows of the Pola projections (:meth:`PolaLinearAttention.projection_rows`), its output
projection the Pola output projection, and its spatial reduction (conv and norm) the
Pola one where both reduce by the same ratio. The gate rows, the exponents
(``power``), ``scale``, the positional encoding and the depthwise conv on the values
exist only in Pola attention and keep their initial values; what exists only in the
softmax attention (a relative position bias table, a reduction of another ratio) is
left unused.
"""
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch.nn as nn

from ..attention import PolaLinearAttention


class Copy(NamedTuple):
    """One copy of rows: Pola tensor (name in the attention, rows) <- softmax tensor."""
    pola: str
    pola_rows: Optional[slice]
    softmax: str
    softmax_rows: Optional[slice]


class _SoftmaxRows(NamedTuple):
    roles: Dict[str, Tuple[str, Optional[str], slice]]  # role -> (weight, bias, rows)
    proj: Tuple[str, Optional[str]]  # weight, bias
    reduction: Optional[Tuple[str, str, int]]  # conv prefix, norm prefix, ratio


def _softmax_rows(module: nn.Module) -> _SoftmaxRows:
    """Where q, k, v, the output projection and the spatial reduction of a softmax
    attention live: ours (``q`` / ``kv`` or ``qkv``), mmdet's PVT attention (an
    ``nn.MultiheadAttention`` as ``attn``, ``sr`` / ``norm``), mmpretrain's
    MultiheadAttention (``qkv``)."""
    params = dict(module.named_parameters())

    def bias(name):
        return name if name in params else None

    def rows(weight, roles):
        dims = params[weight].shape[0] // len(roles)
        bias_name = bias(weight.replace('weight', 'bias'))
        return {
            role: (weight, bias_name, slice(i * dims, (i + 1) * dims))
            for i, role in enumerate(roles)
        }

    if 'qkv.weight' in params:
        roles = rows('qkv.weight', 'qkv')
    elif 'q.weight' in params and 'kv.weight' in params:
        roles = {**rows('q.weight', 'q'), **rows('kv.weight', 'kv')}
    elif 'attn.in_proj_weight' in params:
        roles = rows('attn.in_proj_weight', 'qkv')
    else:
        raise TypeError(f'a warm start cannot read the projections of a softmax attention '
                        f'{type(module).__name__} (parameters {sorted(params)})')
    proj = 'proj' if 'proj.weight' in params else 'attn.out_proj'
    reduction = None
    for conv, norm in (('reduction.sr', 'reduction.norm'), ('sr', 'norm')):
        if f'{conv}.weight' in params:
            reduction = (conv, norm, int(params[f'{conv}.weight'].shape[-1]))
            break
    return _SoftmaxRows(roles, (f'{proj}.weight', bias(f'{proj}.bias')), reduction)


def translate(softmax: nn.Module, pola: PolaLinearAttention) -> Tuple[List[Copy], Dict[str, str]]:
    """The copies that carry the softmax attention ``softmax`` into ``pola`` (names
    inside each module), and the softmax tensors they leave unused, with the reason."""
    src = _softmax_rows(softmax)
    pola_names = set(pola.state_dict())
    copies = []
    for role in 'qkv':
        weight, bias, rows = src.roles[role]
        layer, pola_rows = pola.projection_rows()[role]
        copies.append(Copy(f'{layer}.weight', pola_rows, weight, rows))
        if bias is not None and f'{layer}.bias' in pola_names:
            copies.append(Copy(f'{layer}.bias', pola_rows, bias, rows))
    copies.append(Copy('proj.weight', None, src.proj[0], None))
    if src.proj[1] is not None:
        copies.append(Copy('proj.bias', None, src.proj[1], None))
    reduction_matches = (
        src.reduction is not None and pola.reduction is not None
        and src.reduction[2] == pola.sr_ratio)
    if reduction_matches:
        conv, norm, _ = src.reduction
        for part, prefix in (('sr', conv), ('norm', norm)):
            for name in ('weight', 'bias'):
                if f'{prefix}.{name}' in softmax.state_dict():
                    copies.append(Copy(f'reduction.{part}.{name}', None, f'{prefix}.{name}', None))
    used = {c.softmax for c in copies}
    unused = {}
    for name in softmax.state_dict():
        if name in used:
            continue
        if src.reduction is not None and name.startswith(src.reduction[:2]):
            unused[name] = (f'spatial reduction by {src.reduction[2]}; the Pola attention ' +
                            (f'reduces by {pola.sr_ratio}' if pola.sr_ratio > 1 else 'has none'))
        elif 'relative_position' in name:
            unused[name] = 'relative position bias (Pola attention has none)'
        else:
            unused[name] = 'no counterpart in Pola attention'
    return copies, unused
