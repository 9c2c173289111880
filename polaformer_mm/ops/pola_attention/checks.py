"""The argument checks of every form of the op: :func:`check_inputs` (shapes, dtypes,
devices, ``eps``, ``scale``) and :func:`check_alpha` with its bound :data:`ALPHA_MAX`.

:func:`~polaformer_mm.ops.pola_attention.pola_linear_attention` calls :func:`check_inputs`
with ``check_values=False`` while a graph capture records it (a captured graph cannot branch
on a tensor's values); the naive and reference forms always check values.
"""
import math
import numbers
from typing import Optional, Union

import torch
from torch import Tensor

__all__ = ['ALPHA_MAX', 'EpsType', 'check_alpha', 'check_inputs']

#: ``eps=`` of every form: a positive float, or a tensor broadcastable to (B, h, 1, 1).
EpsType = Union[float, Tensor]

#: The largest ``alpha`` the op takes (:func:`check_alpha` says why).
ALPHA_MAX = 100.0


def check_alpha(alpha) -> float:
    """``alpha`` as a float; a ValueError unless it is a finite number in (0, ``ALPHA_MAX``].

    The bound is one of float32 precision, not of range (the op's shifts carry any
    exponent): a feature is ``exp(p log|x| - M)`` with ``p`` up to ``1 + alpha``, so the
    float32 rounding of ``p log|x|`` (2**-24 relative) moves it by about
    ``3 p |log|x|| 2**-24`` relative, and beyond ``alpha = ALPHA_MAX`` outputs for inputs
    of moderate magnitude (|q|, |k| of 0.1 to 10) lose the 1e-4 accuracy they keep
    below it (docs/advanced_guides/method.md, "The exponent's range").
    """
    if (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha)
            or alpha <= 0):
        raise ValueError('pola_linear_attention: alpha must be a finite number > 0 '
                         f'(the exponent is 1 + alpha * sigmoid(power)); got {alpha!r}')
    if alpha > ALPHA_MAX:
        raise ValueError(
            f'pola_linear_attention: alpha must be at most {ALPHA_MAX:g}; got {alpha!r}. '
            'The exponent 1 + alpha * sigmoid(power) multiplies the float32 rounding of '
            'log|x| (2**-24 relative), and beyond that bound the attention weights of '
            'moderate inputs are off by more than 1e-4')
    return float(alpha)


def _check_dtypes_and_devices(q: Tensor, k: Tensor, v: Tensor, power: Tensor) -> None:
    """A ValueError unless q, k, v and ``power`` are floating point on q's device, and
    q, k and v all float64 or none of them."""
    named = (('q', q), ('k', k), ('v', v))
    for name, t in named + (('power', power), ):
        if not t.dtype.is_floating_point:
            raise ValueError(f'pola_linear_attention: {name} must be a floating-point tensor, '
                             f'got {t.dtype}')
        if t.device != q.device:
            raise ValueError(f'pola_linear_attention: q is on {q.device} but {name} is on '
                             f'{t.device}; all tensors must be on one device')
    wide = [name for name, t in named if t.dtype == torch.float64]
    narrow = [name for name, t in named if t.dtype != torch.float64]
    if wide and narrow:
        a, b = sorted([wide[0], narrow[0]], key='qkv'.index)
        dtypes = dict((name, t.dtype) for name, t in named)
        raise ValueError(f'pola_linear_attention: {a} is {dtypes[a]} but {b} is {dtypes[b]}; '
                         'float64 must be given for q, k and v alike (float16, bfloat16 and '
                         'float32 may be mixed: they are computed in float32)')


def _check_positive(name: str, t: Tensor, why: str) -> None:
    """A ValueError unless every value of ``t`` is finite and > 0 (reads the answer
    back from ``t``'s device)."""
    bad = ~(torch.isfinite(t) & (t > 0))
    if bool(bad.any()):
        value = t.detach()[bad].flatten()[0].item()
        raise ValueError(f'pola_linear_attention: {name} must be finite and > 0 everywhere '
                         f'({why}); the tensor {name} holds {value!r}')


def _check_eps(eps: EpsType, B: int, h: int, check_values: bool) -> None:
    """A ValueError unless ``eps`` is a finite float > 0 or a constant tensor of such
    values broadcastable to (B, h, 1, 1) (its values checked with ``check_values``)."""
    if isinstance(eps, Tensor):
        if eps.requires_grad:
            raise ValueError('pola_linear_attention: a tensor eps is a constant and '
                             'must not require grad')
        try:
            shape = torch.broadcast_shapes(eps.shape, (B, h, 1, 1))
        except RuntimeError:
            shape = None
        if eps.dim() > 4 or shape != (B, h, 1, 1):
            raise ValueError(f'eps shape {tuple(eps.shape)} must broadcast to '
                             f'(B,h,1,1) = {(B, h, 1, 1)}')
        if check_values:
            _check_positive('eps', eps, 'as a float eps must be')
    elif (isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps)
          or eps <= 0):
        raise ValueError(f'pola_linear_attention: eps must be a finite number > 0 or '
                         f'a tensor broadcastable to (B,h,1,1); got {eps!r}')


def check_inputs(q: Tensor,
                 k: Tensor,
                 v: Tensor,
                 power: Tensor,
                 alpha,
                 eps: EpsType,
                 scale: Optional[Tensor] = None,
                 check_values: bool = True) -> float:
    """A ValueError naming the argument unless the arguments of
    :func:`~polaformer_mm.ops.pola_linear_attention` (or of its naive and reference forms,
    without ``scale``) fit together; returns ``alpha`` as a float (:func:`check_alpha`).

    Args:
        q (Tensor): queries (B, h, N, d).
        k (Tensor): keys (B, h, n, d), n >= 1.
        v (Tensor): values, k's shape.
        power (Tensor): (1, h, 1, d).
        alpha: the exponent's range.
        eps (float | Tensor): a float > 0 or a tensor broadcastable to (B, h, 1, 1).
        scale (Tensor, optional): a positive (1, h, 1, d) divisor of q and k.
        check_values (bool): also check that a tensor ``eps`` and ``scale`` hold finite
            positive values (reads them back from the device). Default: True.

    Returns:
        float: ``alpha``.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError('pola_linear_attention expects q (B,h,N,d), k (B,h,n,d) and v '
                         f'(B,h,n,d); got q {tuple(q.shape)}, k {tuple(k.shape)}, '
                         f'v {tuple(v.shape)}')
    B, h, _, d = q.shape
    if k.shape[:2] != (B, h) or k.shape[3] != d:
        raise ValueError(f'k shape {tuple(k.shape)} does not match q shape '
                         f'{tuple(q.shape)} (expected (B,h,n,d))')
    if v.shape != k.shape:
        raise ValueError(f'v shape {tuple(v.shape)} must equal k shape '
                         f'{tuple(k.shape)}')
    if k.shape[2] == 0:
        raise ValueError('pola_linear_attention got zero keys (n == 0)')
    if power.shape != (1, h, 1, d):
        raise ValueError(f'power shape {tuple(power.shape)} must be (1,{h},1,{d})')
    _check_dtypes_and_devices(q, k, v, power)
    _check_eps(eps, B, h, check_values)
    if scale is not None:
        if not isinstance(scale, Tensor) or scale.shape != power.shape:
            shape = tuple(scale.shape) if isinstance(scale, Tensor) else type(scale).__name__
            raise ValueError(f'scale shape {shape} must be that of power '
                             f'{tuple(power.shape)}')
        if not scale.dtype.is_floating_point or scale.device != q.device:
            raise ValueError('pola_linear_attention: scale must be a floating-point tensor '
                             f'on {q.device}; got {scale.dtype} on {scale.device}')
        if check_values:
            _check_positive('scale', scale, 'it divides q and k')
    return check_alpha(alpha)
