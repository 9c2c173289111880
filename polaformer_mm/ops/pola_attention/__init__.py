"""Polarity-aware linear attention (PolaFormer) as a function: the public op and its
dispatch.

The maths is written once, top to bottom, in :mod:`.formulation`
(:func:`~.formulation.pola_linear_attention_plain`, with the method in its module
docstring); :func:`pola_linear_attention` checks the arguments and runs one of three forms
of it:

* under a graph capture (:func:`~polaformer_mm.utils.capture.graph_capture`: the project's
  export tools, a jit trace or script, an ONNX export, ``torch.compile``, ``torch.export``)
  the plain formulation itself, which the captured graph records whole for any token
  count; a trace or an export takes it on CUDA too, in place of the Triton kernels;
* on CUDA with Triton installed (``backend='auto'`` or ``'triton'``) the fused kernels of
  :mod:`.triton_backend` (:mod:`.triton_kernels`);
* otherwise the blocked autograd Function of :mod:`.function`, which keeps only q, k, v,
  ``power``, the key summary (:mod:`.key_summary`) and one number per (batch, head) for
  the backward pass, runs over blocks of tokens that stay in the CPU's caches, and takes
  the exact scheme (:mod:`.exact_scheme`) for the rows the shared shifts
  (:mod:`.shared_shifts`) lose at large ``alpha``.

An ONNX export of the attention modules records a fourth form, which the modules call
themselves: :func:`~.channels_first.pola_linear_attention_channels_first`, the same maths on
heads laid out channels first, written for graph runtimes (:mod:`.channels_first`).

The reference forms (the official order of operations, the explicit N x n weights, the
log-domain form) are in :mod:`.reference`; the argument checks in :mod:`.checks`.
"""
import logging
import os
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from ...utils.capture import graph_capture
from ...utils.compat import is_autocast_enabled, is_compiling
from . import triton_backend
from .channels_first import pola_linear_attention_channels_first
from .checks import ALPHA_MAX, EpsType, check_inputs
from .formulation import pola_exponent, pola_linear_attention_plain
from .function import pola_linear_attention_blocked

__all__ = [
    'pola_linear_attention', 'set_default_backend', 'BACKENDS', 'ALPHA_MAX', 'pola_exponent',
    'pola_linear_attention_plain', 'pola_linear_attention_channels_first'
]

#: Names accepted by ``backend=``, :func:`set_default_backend` and the environment
#: variable ``POLA_ATTENTION_BACKEND``.
BACKENDS = ('auto', 'torch', 'triton')
#: The environment variable that sets the default backend when the op is imported.
BACKEND_ENV = 'POLA_ATTENTION_BACKEND'


def _backend_from_env() -> str:
    value = os.environ.get(BACKEND_ENV, '').strip().lower() or 'auto'
    if value not in BACKENDS:
        raise ValueError(f'{BACKEND_ENV}={os.environ[BACKEND_ENV]!r}: the Pola attention backend '
                         f'must be one of {", ".join(BACKENDS)}')
    return value


_default_backend = _backend_from_env()


def set_default_backend(backend: str) -> str:
    """Set the backend :func:`pola_linear_attention` uses when ``backend`` is None.

    Args:
        backend (str): 'auto' (the Triton kernel for CUDA tensors when Triton can be
            imported, the torch path otherwise), 'torch' or 'triton'. The default when the
            op is imported is ``POLA_ATTENTION_BACKEND`` (unset: 'auto'); a config chooses it
            with ``custom_hooks=[dict(type='PolaAttentionBackendHook', backend=...)]``.

    Returns:
        str: the previous default.
    """
    global _default_backend
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {backend!r}')
    previous, _default_backend = _default_backend, backend
    return previous


def _resolve_backend(backend: Optional[str], q: Tensor, k: Tensor, v: Tensor, power: Tensor,
                     capturing: bool) -> Tuple[str, bool]:
    """'torch' or 'triton' for ``backend`` (None: the default), and whether the choice was
    'auto' (which takes the torch path where the kernels fail at their first launch).

    'auto' takes the kernels for the CUDA tensors they take (CPU ones under
    ``TRITON_INTERPRET=1``; :func:`~.triton_backend.unsupported_reasons`, which includes the
    cases whose first launch failed in this process); a forced 'triton' raises, naming
    those reasons, when they do not take them. A trace or an export (``capturing``, not
    ``torch.compile``) records the plain formulation, also in place of the kernels.
    """
    backend = _default_backend if backend is None else backend
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS} or None, got {backend!r}')
    auto = backend == 'auto'
    if capturing and not is_compiling():
        return 'torch', auto
    if auto:
        if q.device.type != 'cuda' and not triton_backend.interpreting():
            return 'torch', auto
        if not triton_backend.available():
            _log_triton_fallback_once(triton_backend.unavailable_reason())
            return 'torch', auto
        unsupported = triton_backend.unsupported_reasons(q, k, v, power)
        return ('torch' if unsupported else 'triton'), auto
    if backend == 'triton':
        triton_backend.check_supported(q, k, v, power)
    return backend, auto


_triton_fallback_logged = False


def _log_triton_fallback_once(reason: str) -> None:
    """Say once per process that backend='auto' takes the torch path on CUDA, and why."""
    global _triton_fallback_logged
    if _triton_fallback_logged:
        return
    _triton_fallback_logged = True
    from mmengine.logging import print_log  # mmengine only when there is something to say
    print_log(
        f'pola_linear_attention: {reason}; backend="auto" uses the torch path on CUDA',
        logger='current',
        level=logging.WARNING)


def _in_float32_unless_float64(form: Callable[..., Tensor], q: Tensor, k: Tensor, v: Tensor,
                               power: Tensor, alpha: float, eps: EpsType,
                               scale: Optional[Tensor]) -> Tensor:
    """``form(q, k, v, power, alpha, eps, scale)`` (a torch form: the plain formulation or
    the blocked Function); half precision, mixed dtypes and calls under autocast are
    computed in float32 with autocast off, the result in q's dtype."""
    low_precision = (torch.float16, torch.bfloat16)
    if (q.dtype in low_precision or is_autocast_enabled(q.device.type)
            or not q.dtype == k.dtype == v.dtype):
        with torch.autocast(q.device.type, enabled=False):
            out = form(q.float(), k.float(), v.float(), power.float(), alpha, eps,
                       None if scale is None else scale.float())
        return out.to(q.dtype)
    return form(q, k, v, power, alpha, eps, scale)


def pola_linear_attention(q: Tensor,
                          k: Tensor,
                          v: Tensor,
                          power: Tensor,
                          alpha: float = 4.0,
                          eps: EpsType = 1e-6,
                          backend: Optional[str] = None,
                          scale: Optional[Tensor] = None) -> Tensor:
    """Polarity-aware linear attention without any N x n matrix.

    The maths: :func:`~polaformer_mm.ops.pola_attention.formulation.pola_linear_attention_plain`
    (module :mod:`polaformer_mm.ops.pola_attention.formulation`); this function chooses
    the form that computes it (module docstring). Half-precision inputs, inputs mixing
    float16 / bfloat16 / float32, and calls under autocast are computed in float32 and
    the result cast to q's dtype; float64 must be given for q, k and v alike. Every
    tensor must be on q's device. Accurate for every ``alpha`` it takes
    (:mod:`~polaformer_mm.ops.pola_attention.exact_scheme`, "Exponent range").

    Args:
        q (Tensor): queries (B, h, N, d), already divided by the learned scale
            (or see ``scale``); N = 0 gives an empty output.
        k (Tensor): keys (B, h, n, d), n >= 1 (the same).
        v (Tensor): values (B, h, n, d).
        power (Tensor): the raw exponent parameter (1, h, 1, d).
        alpha (float): the exponent is ``1 + alpha * sigmoid(power)``; finite, in
            (0, ``ALPHA_MAX``]. Default: 4.0.
        eps (float | Tensor): added to each normaliser (``sum of scores + n * eps``);
            a positive float, or a tensor broadcastable to (B, h, 1, 1), finite and
            positive everywhere, for one value per batch entry (padded keys: see the
            formulation's docstring). Not differentiated. Default: 1e-6.
        backend (str, optional): 'torch', 'triton' (CUDA tensors, Triton installed,
            head width <= 128) or 'auto' (Triton where it applies, else torch); None
            takes the default of :func:`set_default_backend` ('auto').
        scale (Tensor, optional): a positive, finite (1, h, 1, d) divisor of q and k
            (the modules' ``softplus(scale)``), differentiable: the result of passing
            ``q / scale`` and ``k / scale``, up to rounding. The torch forms fold it
            into the features (``log|x| - log(scale)``), so those two tensors are
            neither computed nor kept for the backward pass. Default: None.

    Returns:
        Tensor: (B, h, N, d), the same-signed stream in the first ``ceil(d/2)`` channels
        of every head and the opposite-signed stream in the rest.
    """
    capturing = graph_capture()
    # a captured graph cannot branch on values: eps and scale are checked when run eagerly
    alpha = check_inputs(q, k, v, power, alpha, eps, scale, check_values=not capturing)
    resolved, auto = _resolve_backend(backend, q, k, v, power, capturing)
    if resolved == 'triton':
        if scale is not None:
            q, k, scale = q / scale, k / scale, None
        if q.shape[0] and q.shape[2]:  # calls without queries: nothing to launch
            try:
                out, rows_lost = triton_backend.pola_linear_attention_triton(
                    q, k, v, power, alpha, eps, fallback=auto)
            except triton_backend.KernelLaunchError:
                if not auto:  # warned once; 'auto' takes the torch path from now on
                    raise
            else:
                if not rows_lost:
                    return out
                # some rows lie far below the shared shifts (large alpha, magnitudes far
                # apart): the torch path, whose exact scheme takes such blocks
    form = pola_linear_attention_plain if capturing else pola_linear_attention_blocked
    return _in_float32_unless_float64(form, q, k, v, power, alpha, eps, scale)
