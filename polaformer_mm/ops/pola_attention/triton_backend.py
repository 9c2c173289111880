"""Fused Triton backend of :func:`polaformer_mm.ops.pola_linear_attention`.

Forward: one pass over the keys per (batch, head) and split of the key rows builds the
key summary (``[k+, k-]^T v`` and the feature sums, with a running shift that keeps every
feature in [0, 1]); the splits are combined into ``W`` (2d x (d+2)); then one pass over
blocks of queries forms ``[q+, q-]`` in registers, multiplies it with ``W`` and divides
per stream. Backward: one pass over the queries (gradient of q, partial gradients of W
and of the exponent), then one pass over the keys (gradients of k and v). Saved for the
backward pass: q, k, v, ``power``, ``W``, the key shift and ``eps`` per (batch, head).

The kernels use the shared shifts of the torch path (one per query row, one for the keys
of a (batch, head)). The query pass reports per split its largest reciprocal
denominator, and :func:`pola_linear_attention_triton` says whether one is past the bound
at which those shifts may lose a row (:func:`~.shared_shifts.shared_shifts_lose_rows`);
the dispatch then computes the call with the torch path, whose exact scheme
takes such blocks (one flag read back per call). Calls without queries take the torch
path too (nothing to launch).

:func:`unsupported_reasons` is the one place that says which inputs the kernels take:
the dispatch chooses by it (``backend='auto'``) and :func:`check_supported` names its
reasons when ``backend='triton'`` is forced. :data:`TOLERANCES` is how far the kernels'
results may lie from the torch path's, per storage dtype (the tests hold them to it).

Storage may be float32, float16 or bfloat16 (any strides); the arithmetic is float32.
The float32 matrix products follow ``torch.backends.cuda.matmul.allow_tf32`` (IEEE by
default, as torch's). Install with ``pip install polaformer_mm[triton]``. With
``TRITON_INTERPRET=1`` set before Triton is imported, the kernels run on CPU tensors
through Triton's interpreter (the tests use this).
"""
import os
import warnings
from typing import Callable, Dict, List, Set, Tuple, TypeVar

import torch
from torch import Tensor

from ...utils.compat import triton_status
from .checks import EpsType
from .formulation import exp_floor, pola_exponent, value_split
from .key_summary import assemble_summary, summary_grads
from .shared_shifts import shared_shifts_lose_rows

# Triton is optional (2.1 or later): without it, or with one that fails to import for any
# reason, the kernels are unavailable and `backend='auto'` takes the torch path.
#: The kernels' module (:mod:`~polaformer_mm.ops.pola_attention.triton_kernels`) once it
#: loaded, else None.
kernels = None
_import_error = triton_status().reason
if _import_error is None:
    try:
        from . import triton_kernels as kernels
    except Exception as error:  # noqa: BLE001  (a Triton whose API differs, a broken build)
        _import_error = (f'the fused kernels do not load with Triton {triton_status().version} '
                         f'({type(error).__name__}: {error})')

__all__ = [
    'available', 'unavailable_reason', 'unsupported_reasons', 'check_supported',
    'pola_linear_attention_triton', 'KernelLaunchError', 'failed_cases', 'interpreting',
    'MAX_HEAD_DIM', 'DTYPES', 'TOLERANCES'
]

#: Storage dtypes the kernels take (their arithmetic is float32).
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: The smallest normal float32, the kernels' floor of magnitudes and of the scaled eps.
TINY = float(torch.finfo(torch.float32).tiny)

#: Largest head width the kernels take (their accumulators are d x d blocks).
MAX_HEAD_DIM = 128

#: Per storage dtype, the largest difference of the kernels' output and gradients from the
#: torch path's, relative to the largest magnitude of the torch path's result: the kernels
#: store half-precision outputs and gradients in the input dtype, and the torch path rounds
#: its float32 result once too, so both differ by about one rounding of that dtype.
TOLERANCES: Dict[torch.dtype, float] = {
    torch.float32: 2e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def available() -> bool:
    """Whether the kernels loaded (Triton >= 2.1 installed and importable)."""
    return kernels is not None


def unavailable_reason() -> str:
    """Why :func:`available` is False (names the installed and the needed Triton), or ''."""
    return _import_error or ''


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``: on CPU
    tensors)."""
    return os.environ.get('TRITON_INTERPRET', '0') == '1'


class KernelLaunchError(RuntimeError):
    """The kernels failed (to compile or to launch) at the first launch of a case; the
    case takes the torch path for the rest of the process (:func:`failed_cases`)."""


#: Per case (device, head width, storage dtype, precision) whose first launch failed, why.
_failed: Dict[tuple, str] = {}
#: The (case, pass) pairs that launched once: 'forward' or 'backward'.
_launched: Set[Tuple[tuple, str]] = set()


def _case(q: Tensor) -> tuple:
    allow_tf32 = q.device.type == 'cuda' and torch.backends.cuda.matmul.allow_tf32
    return (str(q.device), q.shape[-1], q.dtype, dot_precision(q.dtype, allow_tf32))


def failed_cases() -> Dict[tuple, str]:
    """The cases (device, head width, storage dtype, precision) whose first launch failed in
    this process, with the reason; ``backend='auto'`` computes them with the torch path."""
    return dict(_failed)


R = TypeVar('R')


def _first_launch(q: Tensor, stage: str, launch: Callable[[], R]) -> R:
    """``launch()``; at the first ``stage`` ('forward' or 'backward') of q's case, any error
    it raises (Triton's compiler, ptxas, out of resources, the driver) marks the case as
    failed, warns once naming the reason, and raises :class:`KernelLaunchError`."""
    case = _case(q)
    if (case, stage) in _launched:
        return launch()
    try:
        result = launch()
    except Exception as error:  # noqa: BLE001  (whatever a GPU's toolchain raises)
        lines = str(error).strip().splitlines() or ['']
        reason = f'{type(error).__name__}: {lines[0][:300]}'
        _failed[case] = reason
        device, d, dtype, precision = case
        warnings.warn(
            f'pola_linear_attention: the Triton kernels failed at their first {stage} launch '
            f'for head width {d}, {dtype}, {precision} products on {device} ({reason}); this '
            'case takes the torch path for the rest of the process (POLA_ATTENTION_BACKEND=torch '
            'chooses the torch path from the start)',
            RuntimeWarning,
            stacklevel=2)
        raise KernelLaunchError(reason) from error
    _launched.add((case, stage))
    return result


def unsupported_reasons(q: Tensor, k: Tensor, v: Tensor, power: Tensor) -> List[str]:
    """Why the kernels cannot take these inputs, one phrase per reason; empty when they
    can: the kernels loaded (:func:`available`), CUDA tensors (CPU ones under
    ``TRITON_INTERPRET=1``), head width at most :data:`MAX_HEAD_DIM`, q, k, v and
    ``power`` stored in one of :data:`DTYPES`.

    Args:
        q (Tensor): queries (B, h, N, d).
        k (Tensor): keys (B, h, n, d).
        v (Tensor): values (B, h, n, d).
        power (Tensor): the raw exponent parameter (1, h, 1, d).

    Returns:
        list[str]: the reasons, in that order.
    """
    reasons = []
    if kernels is None:
        reasons.append(_import_error)
    if q.device.type != 'cuda' and not interpreting():
        reasons.append(f'the kernels need CUDA tensors (got {q.device})')
    if kernels is not None and interpreting() and kernels.compat.interpreter_problem():
        reasons.append(kernels.compat.interpreter_problem())
    if kernels is not None and _case(q) in _failed:
        reasons.append(f'the kernels failed at their first launch for head width {q.shape[-1]}, '
                       f'{q.dtype} in this process ({_failed[_case(q)]})')
    if q.shape[-1] > MAX_HEAD_DIM:
        reasons.append(f'head width {q.shape[-1]} > {MAX_HEAD_DIM}')
    stored = [
        f'{name} is {t.dtype}' for name, t in (('q', q), ('k', k), ('v', v), ('power', power))
        if t.dtype not in DTYPES
    ]
    if stored:
        reasons.append(', '.join(stored) + ' (the kernels take float32, float16 and bfloat16)')
    return reasons


def check_supported(q: Tensor, k: Tensor, v: Tensor, power: Tensor) -> None:
    """Raise unless the kernels take these inputs, naming every reason of
    :func:`unsupported_reasons`: a RuntimeError when the kernels did not load (it names
    the installed and the needed Triton), else a ValueError.

    Args:
        q (Tensor): queries (B, h, N, d).
        k (Tensor): keys (B, h, n, d).
        v (Tensor): values (B, h, n, d).
        power (Tensor): the raw exponent parameter (1, h, 1, d).
    """
    reasons = unsupported_reasons(q, k, v, power)
    if not reasons:
        return
    what = 'pola_linear_attention(backend="triton"): ' + '; '.join(reasons)
    if kernels is None:
        raise RuntimeError(f'{what} (pip install "polaformer_mm[triton]", or use backend="torch")')
    raise ValueError(f'{what}; use backend="torch"')


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_d(d: int) -> int:
    """The kernels' ``BLOCK_D`` for head width d: the power of two at least d, and
    at least 16 (the smallest ``tl.dot`` operand)."""
    return max(16, 1 << (d - 1).bit_length())


def _splits(rows: int, bh: int, device: torch.device) -> Tuple[int, int]:
    """(rows per program, programs per (batch, head)) for a pass over ``rows``.

    Rows per program are a multiple of every BLOCK_N of the launch configurations.
    """
    block_n = max(config.kwargs['BLOCK_N'] for configs in kernels.CONFIGS.values()
                  for config in configs)
    blocks = _cdiv(rows, block_n)
    if device.type == 'cuda':
        target = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    else:  # the interpreter: several splits, so that their combination is exercised
        target = 16
    splits = max(1, min(blocks, _cdiv(target, bh)))
    rows_per_split = _cdiv(blocks, splits) * block_n
    return rows_per_split, _cdiv(rows, rows_per_split)


def dot_precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    """The kernels' ``PRECISION`` (``tl.dot``'s ``input_precision``) for inputs stored in
    ``dtype`` when ``torch.backends.cuda.matmul.allow_tf32`` is ``allow_tf32``."""
    return 'tf32' if allow_tf32 else 'ieee'


def constants(d: int, precision: str) -> dict:
    """The compile-time arguments every kernel launch passes for head width ``d``, in the
    order the kernels declare them (the autotuner adds ``BLOCK_N``, ``num_warps`` and
    ``num_stages``); the compile report compiles with the same."""
    return dict(
        BLOCK_D=block_d(d), PRECISION=precision, TINY=TINY, EXP_FLOOR=exp_floor(torch.float32))


def _meta(d: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """The compile-time arguments of every kernel launch, passed by position after the
    others (so that each Triton release finds the autotune key and the pruning sees
    them: :mod:`.triton_kernels`)."""
    allow_tf32 = device.type == 'cuda' and torch.backends.cuda.matmul.allow_tf32
    return tuple(constants(d, dot_precision(dtype, allow_tf32)).values())


def _eps_per_head(eps: EpsType, B: int, h: int, device: torch.device) -> Tensor:
    if isinstance(eps, Tensor):
        return eps.detach().to(
            device=device, dtype=torch.float32).expand(B, h, 1, 1).reshape(B * h).contiguous()
    return torch.full((B * h, ), float(eps), dtype=torch.float32, device=device)


def _forward_launches(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float,
                      eps: EpsType) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The forward kernels: the output, the largest reciprocal denominators per split, and
    what the backward pass takes (W, the key shifts, eps per (batch, head))."""
    B, h, N, d = q.shape
    n = k.shape[2]
    bh = B * h
    device = q.device
    meta, opts = _meta(d, q.dtype, device), kernels.LAUNCH_OPTIONS
    p = pola_exponent(power.detach().float(), alpha).reshape(h, d).contiguous()
    eps_bh = _eps_per_head(eps, B, h, device)

    rows, splits = _splits(n, bh, device)
    kv_part = torch.empty(bh, splits, 2 * d, d, dtype=torch.float32, device=device)
    sum_part = torch.empty(bh, splits, 2 * d, dtype=torch.float32, device=device)
    shift_part = torch.empty(bh, splits, dtype=torch.float32, device=device)
    kernels.key_summary_kernel[(bh, splits, 2)](k, v, p, kv_part, sum_part, shift_part, *k.stride(),
                                                *v.stride(), h, n, d, rows, splits, *meta, **opts)
    k_shift = shift_part.amax(dim=1)
    rescale = torch.exp(shift_part - k_shift[:, None])
    kv = torch.einsum('bsij,bs->bij', kv_part, rescale).div_(n)
    k_mean = torch.einsum('bsi,bs->bi', sum_part, rescale).div_(n)
    W = assemble_summary(kv, k_mean).contiguous()

    out = torch.empty_like(q)
    rows, splits = _splits(N, bh, device)
    largest_inv_den = torch.empty(bh, splits, dtype=torch.float32, device=device)
    kernels.query_forward_kernel[(bh, splits)](q, W, p, eps_bh, k_shift, out,
                                               largest_inv_den, *q.stride(), *out.stride(), h, N, d,
                                               value_split(d), rows, splits, *meta, **opts)
    return out, largest_inv_den, W, k_shift, eps_bh


def _backward_launches(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, W: Tensor,
                       k_shift: Tensor, eps_bh: Tensor,
                       grad_out: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward kernels: the gradients of q, k, v and ``power``."""
    B, h, N, d = q.shape
    n = k.shape[2]
    bh = B * h
    device = q.device
    meta, opts = _meta(d, q.dtype, device), kernels.LAUNCH_OPTIONS
    p = pola_exponent(power.detach().float(), alpha).reshape(h, d).contiguous()

    g_q = torch.empty_like(q)
    rows, splits = _splits(N, bh, device)
    den_grads = torch.empty(bh, N, 2, dtype=torch.float32, device=device)
    kernels.query_backward_rows_kernel[(bh, splits)](q, grad_out, W, p, eps_bh, k_shift, den_grads,
                                                     *q.stride(), *grad_out.stride(), h, N, d,
                                                     value_split(d), rows, *meta, **opts)
    gp_q = torch.empty(bh, splits, 2, d, dtype=torch.float32, device=device)
    kernels.query_backward_kernel[(bh, splits, 2)](q, grad_out, W, p, eps_bh, k_shift, den_grads,
                                                   g_q, gp_q, *q.stride(),
                                                   *grad_out.stride(), *g_q.stride(), h, N, d,
                                                   value_split(d), rows, splits, *meta, **opts)
    gw_part = torch.empty(bh, splits, 2 * d, d + 2, dtype=torch.float32, device=device)
    kernels.summary_backward_kernel[(bh, splits, 2)](q, grad_out, W, p, eps_bh, k_shift, den_grads,
                                                     gw_part, *q.stride(), *grad_out.stride(), h, N,
                                                     d, value_split(d), rows, splits, *meta, **opts)
    g_kv, g_mean = summary_grads(gw_part.sum(dim=1), d)
    g_kv = g_kv.div_(n).contiguous()
    g_mean = g_mean.div_(n).contiguous()

    g_k = torch.empty_like(k)
    g_v = torch.empty_like(v)
    rows, splits = _splits(n, bh, device)
    kernels.value_backward_kernel[(bh, splits)](k, p, k_shift, g_kv, g_v, *k.stride(),
                                                *g_v.stride(), h, n, d, rows, *meta, **opts)
    gp_k = torch.empty(bh, splits, 2, d, dtype=torch.float32, device=device)
    key_grid = lambda meta: (bh, splits, 2 * _cdiv(d, meta['BLOCK_J']))  # streams x tiles
    kernels.key_backward_kernel[key_grid](k, v, p, k_shift, g_kv, g_mean, g_k, gp_k, *k.stride(),
                                          *v.stride(), *g_k.stride(), h, n, d, rows, splits, *meta,
                                          **opts)
    g_p = (gp_q.sum(dim=(1, 2)) + gp_k.sum(dim=(1, 2))).reshape(B, h, d).sum(dim=0)
    s = torch.sigmoid(power.detach().float()).reshape(h, d)
    g_power = g_p.mul_(s * (1 - s) * alpha).reshape(power.shape).to(power.dtype)
    return g_q, g_k, g_v, g_power


def _torch_path_grads(q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, eps: EpsType,
                      grad_out: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of q, k, v and ``power`` by the torch path (in float32), for a case whose
    backward kernels failed at their first launch."""
    from .function import pola_linear_attention_blocked
    with torch.enable_grad():
        inputs = [t.detach().float().requires_grad_() for t in (q, k, v, power)]
        out = pola_linear_attention_blocked(*inputs, alpha, eps, None)
        grads = torch.autograd.grad(out, inputs, grad_out.float())
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v, power)))


class _PolaAttentionTriton(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, power: Tensor, alpha: float, eps: EpsType,
                fallback: bool) -> Tensor:
        out, largest_inv_den, W, k_shift, eps_bh = _first_launch(
            q, 'forward', lambda: _forward_launches(q, k, v, power, alpha, eps))
        ctx.alpha, ctx.eps, ctx.fallback = alpha, eps, fallback
        ctx.save_for_backward(q, k, v, power, W, k_shift, eps_bh)
        ctx.mark_non_differentiable(largest_inv_den)
        return out, largest_inv_den

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor, grad_largest_inv_den: Tensor):
        q, k, v, power, W, k_shift, eps_bh = ctx.saved_tensors
        try:
            grads = _first_launch(
                q, 'backward',
                lambda: _backward_launches(q, k, v, power, ctx.alpha, W, k_shift, eps_bh, grad_out))
        except KernelLaunchError:
            if not ctx.fallback:
                raise
            grads = _torch_path_grads(q, k, v, power, ctx.alpha, ctx.eps, grad_out)
        return (*grads, None, None, None)


def pola_linear_attention_triton(q: Tensor,
                                 k: Tensor,
                                 v: Tensor,
                                 power: Tensor,
                                 alpha: float,
                                 eps: EpsType,
                                 fallback: bool = False) -> Tuple[Tensor, bool]:
    """The fused kernels; arguments as :func:`~polaformer_mm.ops.pola_linear_attention`
    (already checked there), inputs the kernels take (:func:`check_supported`, which
    this calls) and at least one query (B, N >= 1). Computes in float32.

    Args:
        q (Tensor): queries (B, h, N, d), on CUDA (CPU under ``TRITON_INTERPRET=1``).
        k (Tensor): keys (B, h, n, d).
        v (Tensor): values (B, h, n, d).
        power (Tensor): the raw exponent parameter (1, h, 1, d).
        alpha (float): the exponent is ``1 + alpha * sigmoid(power)``.
        eps (float | Tensor): a float or a tensor broadcastable to (B, h, 1, 1).
        fallback (bool): when the backward kernels fail at their first launch of this case,
            compute the gradients with the torch path instead of raising (the dispatch's
            ``backend='auto'``). A failure of the forward kernels raises
            :class:`KernelLaunchError` either way (after one warning), and the case counts as
            failed for the rest of the process (:func:`failed_cases`).

    Returns:
        tuple[Tensor, bool]: the output (B, h, N, d) in q's dtype and memory layout, and
        whether the shared shifts lost some row (large ``alpha``, magnitudes far apart):
        then that output is not the op's, and the caller computes the call with the
        torch path, whose exact scheme takes such rows.
    """
    check_supported(q, k, v, power)
    if q.shape[0] == 0 or q.shape[2] == 0:
        raise ValueError('pola_linear_attention_triton: no queries (q shape '
                         f'{tuple(q.shape)}), nothing to launch; the torch path takes such calls')
    with torch.autocast(q.device.type, enabled=False):
        out, largest_inv_den = _PolaAttentionTriton.apply(q, k, v, power, alpha, eps, fallback)
    return out, shared_shifts_lose_rows(largest_inv_den)
