r"""Polarity-aware linear attention (PolaFormer) as functions.

Inputs are split into heads, ``q`` (B, h, N, d), ``k`` and ``v`` (B, h, n, d), with q and k
already divided by ``softplus(scale)`` or that divisor given as ``scale=`` (folded into the
features by :func:`pola_linear_attention`). ``power`` is the raw learned (1, h, 1, d)
parameter; the exponent of channel j is :math:`p_j = 1 + \alpha\,\sigma(\text{power}_j) > 1`.

The maths. The polarity features of a vector x are :math:`x^+ = \text{relu}(x)^p` and
:math:`x^- = \text{relu}(-x)^p` (element-wise, exponent per channel). For query i and key t
the same-signed score is :math:`s_{it} = q_i^+ \cdot k_t^+ + q_i^- \cdot k_t^-` and the
opposite-signed score :math:`o_{it} = q_i^- \cdot k_t^+ + q_i^+ \cdot k_t^-`. With the values
split as ``torch.chunk(v, 2, -1)`` does (``v1``: the first ``ceil(d/2)`` channels, ``v2``:
the rest) the output of query i is

.. math::

    \text{out}_i = \Big[\frac{\sum_t s_{it} v1_t}{\sum_t s_{it} + n\,\epsilon},\;
                        \frac{\sum_t o_{it} v2_t}{\sum_t o_{it} + n\,\epsilon}\Big]

(B, h, N, d). Three implementations of this one formula:

* :func:`pola_linear_attention` (this module: the public API and the choice of backend),
  the one to use. Both streams are products of :math:`Q = [q^+, q^-]` (N x 2d) with one
  (2d x (d + 2)) summary ``W`` of the keys (the key-value sums
  :math:`[k^+, k^-]^\top v / n` with their rows rearranged per stream, and the two key
  means), so it costs O((N + n) d^2) and never forms an N x n matrix. Its torch backend
  (:mod:`polaformer_mm.ops.pola_attention_torch`) is a :class:`torch.autograd.Function`
  that keeps only q, k, v, ``power``, ``W`` and one number per (batch, head) for the
  backward pass, and recomputes the polarity features there. On CUDA with Triton
  installed a fused kernel does the same (:mod:`polaformer_mm.ops.pola_attention_triton`);
  ``backend`` chooses. Under a graph capture (a jit trace, an ONNX export with either
  exporter, ``torch.compile`` or ``torch.export``) the torch path takes a plain tensor
  formulation of the same computation instead (the same features, shifts and scaled
  ``eps``; out-of-place operations, no autograd Function, no blocks), which the captured
  graph records whole for any token count; a trace or an export takes it on CUDA too, in
  place of the Triton kernel.
* :func:`~polaformer_mm.ops.pola_attention_naive.pola_linear_attention_naive`: the order
  of operations of the official code (``relu(x) ** p`` and ``relu(-x) ** p`` separately,
  each stream its own ``K^T v`` and normaliser, autograd through all of it). Benchmarks
  compare against it.
* :func:`~polaformer_mm.ops.pola_attention_naive.pola_linear_attention_reference`: the
  explicit N x n weights of both streams, which is what the method means. O(N n)
  memory: tests only.

Magnitudes. ``relu(q) ** p`` with p up to 1 + alpha overflows float32 for ordinary
magnitudes (|q| = 1e4, p = 5) and float16 far earlier. The output does not change when all
polarity features of one query are multiplied by a positive constant c, or all key
features of one (batch, head), except that ``eps`` then weighs as ``eps / c``. So
:func:`pola_linear_attention` computes the features as :math:`\exp(p \log|x| - M)`, where
``M`` is the largest :math:`p_j \log|x_j|` of the query row (for keys: of the whole
(batch, head)), clamped below at 0, and multiplies ``eps`` by :math:`e^{-(M_q + M_k)}`:
the quotient is the one above up to rounding, every feature lies in [0, 1], and exact
zeros stay exact zeros (they never raise ``M``). The features of non-zero inputs and the
scaled ``eps`` are kept at or above the smallest normal number (``torch.finfo(dtype).tiny``:
exponents are floored at ``log(tiny) + 1/8``, since ``exp(log(tiny))`` rounds to a
subnormal in float32), which keeps the vectorised CPU ``exp`` off its slow path (about
50 times slower on subnormal results) and 0 / (0 + eps) at 0; next to
the row's largest feature (1 when M > 0) or to ``eps`` (when M = 0) the change is below the
rounding of the output. The gradients at exact zeros are 0 (the slope of
``relu(x) ** p`` at 0).

Exponent range. These shared shifts lose a row when every term of one of its streams
lies far below them: a score is a query feature times a key feature, each floored near
``tiny``, and with p up to 1 + alpha the exponents of one (batch, head) spread by
``(1 + alpha)`` times the spread of ``log|x|`` (already at alpha = 50 for keys drawn
as ``randn + 1.5``, mostly positive, and queries ``randn``). Each block of queries therefore
checks its denominators; where one is below ``tiny * 2**50`` the block is computed
with an exact scheme instead (the torch path's exact blocks): the keys of each channel and
sign shifted by their own largest exponent, each query row per stream by the largest
exponent it meets there, so that the largest term of every row and stream is 1 x (a key
mean of at least 1 / n). For moderate magnitudes at the usual alpha no block needs it.
What remains is float32 precision: the rounding of ``p log|x|`` grows with p, which is
why :func:`~polaformer_mm.ops._pola_common.check_alpha` refuses ``alpha > ALPHA_MAX``.
Below that bound the output of float32 inputs of moderate magnitude is within 1e-4 of
the exact one, and it is finite for every finite input.

``eps`` may be a float or a tensor broadcastable to (B, h, 1, 1), applied per batch entry
(and head). That serves callers whose keys include padding: zero keys have zero polarity
features and add nothing to the sums, so a call with keys padded by zero rows (k and v set
to exactly zero there) and ``eps * n_real / n`` per entry equals, up to rounding, the call
on the ``n_real`` real keys alone.

The shared maths (argument checks, exponent, value split, scaled features, key
summary) lives in :mod:`polaformer_mm.ops._pola_common`, which both backends import;
this module imports both backends.
"""
import logging
from typing import Optional

from torch import Tensor

from ..utils.compat import in_graph_capture, is_compiling
from . import pola_attention_torch, pola_attention_triton
from ._pola_common import EpsType, check_inputs

__all__ = ['pola_linear_attention', 'set_default_backend', 'BACKENDS']

#: Names accepted by ``backend=`` and :func:`set_default_backend`.
BACKENDS = ('auto', 'torch', 'triton')
_default_backend = 'auto'


def set_default_backend(backend: str) -> str:
    """Set the backend :func:`pola_linear_attention` uses when ``backend`` is None.

    Args:
        backend (str): 'auto' (the Triton kernel for CUDA tensors when Triton can be
            imported, the torch path otherwise), 'torch' or 'triton'.

    Returns:
        str: the previous default.
    """
    global _default_backend
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {backend!r}')
    previous, _default_backend = _default_backend, backend
    return previous


def _resolve_backend(backend: Optional[str], q: Tensor, k: Tensor, v: Tensor, power: Tensor) -> str:
    """'torch' or 'triton' for ``backend`` (None: the default).

    'auto' takes the kernels for the CUDA tensors they take
    (:func:`~polaformer_mm.ops.pola_attention_triton.unsupported_reasons`); a forced
    'triton' raises, naming those reasons, when they do not take them. A trace or an
    export (not ``torch.compile``) records the torch path's plain formulation, also in
    place of the kernels.
    """
    backend = _default_backend if backend is None else backend
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS} or None, got {backend!r}')
    if in_graph_capture() and not is_compiling():
        return 'torch'
    if backend == 'auto':
        if q.device.type != 'cuda':
            return 'torch'
        if not pola_attention_triton.available():
            _log_triton_fallback_once(pola_attention_triton.unavailable_reason())
            return 'torch'
        return 'torch' if pola_attention_triton.unsupported_reasons(q, k, v, power) else 'triton'
    if backend == 'triton':
        pola_attention_triton.check_supported(q, k, v, power)
    return backend


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


def pola_linear_attention(q: Tensor,
                          k: Tensor,
                          v: Tensor,
                          power: Tensor,
                          alpha: float = 4.0,
                          eps: EpsType = 1e-6,
                          backend: Optional[str] = None,
                          scale: Optional[Tensor] = None) -> Tensor:
    """Polarity-aware linear attention without any N x n matrix.

    Half-precision inputs, inputs mixing float16 / bfloat16 / float32, and calls under
    autocast are computed in float32 and the result cast to q's dtype; float64 must be
    given for q, k and v alike. Every tensor must be on q's device. Accurate for every
    ``alpha`` it takes (module docstring, "Exponent range").

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
            positive everywhere, for one value per batch entry (see the module
            docstring on padded keys). Not differentiated. Default: 1e-6.
        backend (str, optional): 'torch', 'triton' (CUDA tensors, Triton installed,
            head width <= 128) or 'auto' (Triton where it applies, else torch); None
            takes the default of :func:`set_default_backend` ('auto').
        scale (Tensor, optional): a positive, finite (1, h, 1, d) divisor of q and k
            (the modules' ``softplus(scale)``), differentiable: the result of passing
            ``q / scale`` and ``k / scale``, up to rounding. The torch path folds it
            into the features (``log|x| - log(scale)``), so those two tensors are
            neither computed nor kept for the backward pass. Default: None.

    Returns:
        Tensor: (B, h, N, d), the same-signed stream in the first ``ceil(d/2)`` channels
        of every head and the opposite-signed stream in the rest.
    """
    alpha = check_inputs(q, k, v, power, alpha, eps, scale)
    if _resolve_backend(backend, q, k, v, power) == 'triton':
        if scale is not None:
            q, k, scale = q / scale, k / scale, None
        if q.shape[0] and q.shape[2]:  # calls without queries: nothing to launch
            out, rows_lost = pola_attention_triton.pola_linear_attention_triton(
                q, k, v, power, alpha, eps)
            if not rows_lost:
                return out
            # some rows lie far below the shared shifts (large alpha, magnitudes far
            # apart): the torch path, whose exact scheme takes such blocks
    return pola_attention_torch.pola_linear_attention_torch(q, k, v, power, alpha, eps, scale)
