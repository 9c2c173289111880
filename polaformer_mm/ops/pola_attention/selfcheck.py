"""A self-check of the fused Triton kernels on the machine at hand, with torch and Triton only.

:func:`run_selfcheck` (the logic of ``tools/kernel_check.py``) compares
:func:`~polaformer_mm.ops.pola_attention.pola_linear_attention` with ``backend='triton'``
against ``backend='torch'``, forward and backward (the gradients of q, k, v and ``power``),
for every storage dtype of :data:`~.triton_backend.TOLERANCES` and head widths 32, 64 and
128, at odd token counts (N = 1, 7, 1001, ..., n != N) and on the shared-shift edge cases
(``alpha=100`` with keys of one sign far weaker, where the kernels hand the call to the
torch path; magnitudes of 1e4; exact zeros; float32 subnormals; padded keys with a tensor
``eps``; keys growing along the sequence; heads split from a token-major layout). Each
comparison is the largest difference relative to the largest magnitude of the torch path's
result (:func:`relative_error`), held to :data:`~.triton_backend.TOLERANCES` of the storage
dtype. Then it times forward and forward + backward of the Triton path, the torch path
and ``torch.nn.functional.scaled_dot_product_attention`` at PVT stage-1 token counts.

It prints one table, a row as soon as it is measured, and returns every row
(:func:`run_selfcheck`); :func:`write_json` writes them. It needs only torch, Triton and
this op's folder (with :mod:`polaformer_mm.utils.compat` and
:mod:`polaformer_mm.utils.capture`): no OpenMMLab package.
"""
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, TextIO, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import pola_linear_attention, triton_backend
from .triton_backend import interpreting

__all__ = [
    'Case', 'FULL_CASES', 'QUICK_CASES', 'TIMING_SHAPES', 'QUICK_TIMING_SHAPES', 'Row', 'Table',
    'relative_error', 'make_inputs', 'with_subnormals', 'check_case', 'time_paths', 'summarize',
    'run_selfcheck', 'write_json', 'environment', 'interpreting', 'interpreter_problem'
]

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16


@dataclass(frozen=True)
class Case:
    """One comparison of the kernels with the torch path.

    ``kind`` shapes the inputs (:func:`make_inputs`): 'plain' (normal q, k, v), 'one_sign'
    (negative queries, keys of that sign 100 times weaker: with ``alpha=100`` the kernels'
    shared shifts lose rows and the call goes to the torch path, which must still be
    exact), 'large' (q, k times 1e4, ``power`` 10), 'meet_zero' (the same with a query row
    and a key channel of zeros), 'zeros' (exact zeros in q and k), 'subnormal' (float32
    subnormals scattered over q and k: :func:`with_subnormals`), 'padded' (zero keys after
    each batch entry's real ones, ``eps`` a (B, 1, 1, 1) tensor), 'growing' (keys growing
    1000-fold along the sequence), 'strided' (heads split from (B, N, h*d) tokens).
    """
    name: str
    B: int
    h: int
    N: int
    n: int
    d: int
    dtype: torch.dtype
    kind: str = 'plain'
    alpha: float = 4.0

    @property
    def shape(self) -> str:
        """'B,h,N,n,d' for the table."""
        return f'{self.B},{self.h},{self.N},{self.n},{self.d}'


#: The cases of a run on a GPU: odd token counts with every head width and storage dtype,
#: then the shared-shift edge cases.
FULL_CASES: Tuple[Case, ...] = (
    Case('f32_d32_N1', 2, 2, 1, 29, 32, f32),
    Case('f32_d32_N1001_n1237', 2, 2, 1001, 1237, 32, f32),
    Case('f32_d64_N7_n300', 1, 3, 7, 300, 64, f32),
    Case('f32_d64_N4099_n3001', 1, 2, 4099, 3001, 64, f32),
    Case('f32_d128_N1001_n517', 2, 1, 1001, 517, 128, f32),
    Case('f16_d64_N1001_n1237', 2, 2, 1001, 1237, 64, f16),
    Case('f16_d128_N333_n1001', 1, 2, 333, 1001, 128, f16),
    Case('bf16_d32_N1001_n777', 2, 2, 1001, 777, 32, bf16),
    Case('bf16_d64_N7_n3', 1, 2, 7, 3, 64, bf16),
    Case('bf16_d128_N129_n65', 1, 1, 129, 65, 128, bf16),
    Case('edge_alpha100_one_sign_keys', 2, 2, 1001, 777, 32, f32, 'one_sign', 100.0),
    Case('edge_large_magnitudes', 1, 2, 1001, 517, 64, f32, 'large'),
    Case('edge_large_query_zero_keys', 1, 2, 9, 12, 32, f32, 'meet_zero'),
    Case('edge_exact_zeros', 2, 2, 17, 1001, 64, f32, 'zeros'),
    Case('edge_subnormal_inputs', 2, 2, 33, 517, 64, f32, 'subnormal'),
    Case('edge_growing_keys', 2, 4, 50, 3001, 32, f32, 'growing'),
    Case('edge_padded_keys_eps_tensor', 3, 2, 19, 400, 32, f32, 'padded'),
    Case('edge_strided_layout_f16', 2, 3, 1001, 1001, 64, f16, 'strided'),
    Case('edge_no_queries', 2, 2, 0, 30, 32, f32),
)

#: The cases of ``--quick`` (Triton's interpreter on a CPU: small token counts).
QUICK_CASES: Tuple[Case, ...] = (
    Case('f32_d32_N1', 1, 1, 1, 9, 32, f32),
    Case('f32_d32_N37_n29', 2, 2, 37, 29, 32, f32),
    Case('f32_d64_N7_n70', 1, 2, 7, 70, 64, f32),
    Case('f32_d128_N9_n5', 1, 1, 9, 5, 128, f32),
    Case('f16_d64_N21_n33', 1, 2, 21, 33, 64, f16),
    Case('bf16_d32_N19_n45', 2, 1, 19, 45, 32, bf16),
    Case('edge_alpha100_one_sign_keys', 1, 2, 20, 15, 32, f32, 'one_sign', 100.0),
    Case('edge_large_magnitudes', 1, 2, 33, 21, 32, f32, 'large'),
    Case('edge_exact_zeros', 2, 2, 17, 23, 32, f32, 'zeros'),
    Case('edge_subnormal_inputs', 1, 2, 19, 27, 32, f32, 'subnormal'),
    Case('edge_growing_keys', 1, 2, 20, 150, 32, f32, 'growing'),
    Case('edge_padded_keys_eps_tensor', 3, 1, 9, 24, 32, f32, 'padded'),
    Case('edge_strided_layout', 1, 2, 13, 13, 32, f32, 'strided'),
    Case('edge_no_queries', 1, 2, 0, 10, 32, f32),
)

#: (B, h, N) of the timing rows at d = 64: PVT stage-1 token counts (56x56, 112x112,
#: 224x224), keys n = N as in self-attention.
TIMING_SHAPES: Tuple[Tuple[int, int, int], ...] = ((2, 1, 3136), (2, 1, 12544), (2, 1, 50176))
QUICK_TIMING_SHAPES: Tuple[Tuple[int, int, int], ...] = ((1, 1, 64), )
TIMING_HEAD_DIM = 64

#: The columns of the table.
COLUMNS = ('row', 'case', 'dtype', 'B,h,N,n,d', 'result', 'value', 'bound / ratios', 's')
WIDTHS = (12, 30, 8, 18, 6, 28, 28, 6)

#: The bound of the Triton path's output against the torch path in float64 where the
#: kernels hand the call over (alpha = 100): the accuracy the op keeps up to ``ALPHA_MAX``
#: (:func:`~.checks.check_alpha`), or the dtype's tolerance if that is wider.
EXACT_BOUND = 1e-4


@dataclass
class Row:
    """One row of the table: a check ('check'), a timing ('time fwd', 'time fwd+bwd') or
    the kernels' loading ('kernels'). ``result`` is PASS / FAIL / SKIP for checks, ok /
    OOM / error / SKIP for timings."""
    row: str
    case: str
    dtype: str
    shape: str
    result: str
    value: str = ''
    bound: str = ''
    seconds: float = 0.0
    details: Dict[str, object] = field(default_factory=dict)

    def cells(self) -> Tuple[str, ...]:
        """The row's cells in the order of :data:`COLUMNS`."""
        return (self.row, self.case, self.dtype, self.shape, self.result, self.value, self.bound,
                f'{self.seconds:.1f}')

    def as_dict(self) -> dict:
        """The row for the JSON file."""
        return dict(
            row=self.row,
            case=self.case,
            dtype=self.dtype,
            shape=self.shape,
            result=self.result,
            value=self.value,
            bound=self.bound,
            seconds=round(self.seconds, 3),
            **self.details)


class Table:
    """Prints the rows of one table as they come (flushed), and keeps them; ``on_row`` is
    called with every row list after a row is added (to save what was measured so far)."""

    def __init__(self,
                 stream: Optional[TextIO] = None,
                 on_row: Optional[Callable[[List[Row]], None]] = None):
        self.stream = stream if stream is not None else sys.stdout
        self.rows: List[Row] = []
        self.on_row = on_row
        self._line(COLUMNS)
        self._line(tuple('-' * w for w in WIDTHS))

    def _line(self, cells: Sequence[str]) -> None:
        text = ' | '.join(c.ljust(w) for c, w in zip(cells, WIDTHS))
        self.stream.write(f'| {text} |\n')
        self.stream.flush()

    def add(self, row: Row) -> Row:
        """Print ``row`` now and keep it."""
        self.rows.append(row)
        self._line(row.cells())
        if self.on_row is not None:
            self.on_row(self.rows)
        return row


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace('torch.', '')


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """The largest ``|actual - expected|`` relative to the largest ``|expected|`` (in
    float64); ``inf`` when the shapes differ or ``actual`` holds a NaN or an infinity, 0
    for empty tensors and for two all-zero ones."""
    if actual.shape != expected.shape:
        return math.inf
    if actual.numel() == 0:
        return 0.0
    a, b = actual.detach().double(), expected.detach().double()
    if not bool(torch.isfinite(a).all()):
        return math.inf
    diff = float((a - b).abs().max())
    scale = float(b.abs().max())
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0 else math.inf


def make_inputs(case: Case, device: torch.device) -> Tuple[List[Tensor], object, Tensor]:
    """([q, k, v, power], eps, grad of the output) of ``case`` on ``device``: seeded
    normal values shaped by ``case.kind`` (:class:`Case`); q, k, v and the output's
    gradient in ``case.dtype``, ``power`` float32."""
    B, h, N, n, d = case.B, case.h, case.N, case.n, case.d
    g = torch.Generator().manual_seed(1000 * B + 10 * N + d)
    q = torch.randn(B, h, N, d, generator=g)
    k = torch.randn(B, h, n, d, generator=g)
    v = torch.randn(B, h, n, d, generator=g)
    power = torch.randn(1, h, 1, d, generator=g)
    grad = torch.randn(B, h, N, d, generator=g)
    eps: object = 1e-6
    if case.kind == 'padded':  # batch entries with 1/8, all and half of the keys real
        n_real = torch.tensor([max(1, n // 8), n, n // 2 + 1, n // 3 + 1])[:B]
        keep = (torch.arange(n) < n_real[:, None]).reshape(B, 1, n, 1)
        k, v = k * keep, v * keep
        eps = (1e-2 * n_real / n).reshape(B, 1, 1, 1).float().to(device)
    elif case.kind == 'large':
        q, k = q * 1e4, k * 1e4
        power = torch.full_like(power, 10.)
    elif case.kind == 'meet_zero':  # 0 / (0 + eps) under large shifts
        q, k = q * 1e4, k * 1e4
        power = torch.full_like(power, 10.)
        q[..., 0, 1:] = 0
        k[..., 0] = 0
    elif case.kind == 'growing':  # a key split's running shift grows block by block
        k = k * torch.logspace(0, 3, n).reshape(1, 1, n, 1)
    elif case.kind == 'one_sign':  # the same-signed stream lies far below the shared shifts
        q = -q.abs() * 3
        k = torch.where(k > 0, k * 3, k * 0.03)
    elif case.kind == 'zeros':
        q[..., ::3] = 0
        q[:, :, 0] = 0
        k[:, :, 1::2, 1] = 0
        k[-1, 0] = 0
    elif case.kind == 'subnormal':  # float32 subnormals in q and k, of both signs
        q, k = with_subnormals(q, 1), with_subnormals(k, 2)
    elif case.kind != 'plain' and case.kind != 'strided':
        raise ValueError(f'unknown case kind {case.kind!r}')
    q, k, v, grad = (t.to(device=device, dtype=case.dtype) for t in (q, k, v, grad))
    power = power.to(device)
    if case.kind == 'strided':  # heads split from (B, N, h*d) tokens, as the models do
        q, k, v, grad = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, grad))
    return [q, k, v, power], eps, grad


def with_subnormals(x: Tensor, first: int) -> Tensor:
    """x with every seventh entry (in memory order, from ``first`` on) replaced by a
    float32 subnormal of its sign (magnitudes from 2**-127 down to 2**-148): scattered
    over rows and channels, so that no channel is subnormal throughout."""
    flat = x.clone().reshape(-1)
    part = flat[first::7]
    scale = 2.0**-torch.randint(127, 149, part.shape, generator=torch.Generator().manual_seed(7))
    flat[first::7] = torch.where(part < 0, -scale, scale)
    return flat.reshape(x.shape)


def _forward_backward(inputs: Sequence[Tensor], eps, grad: Tensor, alpha: float,
                      backend: str) -> List[Tensor]:
    """[output, grad q, grad k, grad v, grad power] of the op on fresh leaves."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = pola_linear_attention(*leaves, alpha=alpha, eps=eps, backend=backend)
    out.backward(grad)
    return [out.detach()] + [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves]


def _real_keys_output(inputs: Sequence[Tensor], case: Case) -> Tensor:
    """The torch path's output of each batch entry of a 'padded' case on its real keys
    alone, with the eps a tensor eps of ``1e-2 * n_real / n`` stands for (1e-2)."""
    q, k, v, power = inputs
    outs = []
    for b in range(case.B):
        real = k[b, 0].abs().sum(-1) > 0
        with torch.no_grad():
            outs.append(
                pola_linear_attention(
                    q[b:b + 1],
                    k[b:b + 1, :, real],
                    v[b:b + 1, :, real],
                    power,
                    alpha=case.alpha,
                    eps=1e-2,
                    backend='torch'))
    return torch.cat(outs)


def check_case(case: Case, device: torch.device) -> Row:
    """Compare the Triton path with the torch path on ``case``: the output and the four
    gradients, each within ``TOLERANCES[case.dtype]`` of the torch path's (relative to its
    largest magnitude); a 'one_sign' case also against the torch path in float64, a
    'padded' one against the real keys alone, a 'strided' one keeps q's strides. A row
    FAIL names the worst tensor (an exception is a FAIL too, with its message)."""
    tol = triton_backend.TOLERANCES[case.dtype]
    row = Row(
        'check', case.name, _dtype_name(case.dtype), case.shape, 'FAIL', bound=f'<= {tol:.1e}')
    start = time.perf_counter()
    try:
        inputs, eps, grad = make_inputs(case, device)
        tri = _forward_backward(inputs, eps, grad, case.alpha, 'triton')
        ref = _forward_backward(inputs, eps, grad, case.alpha, 'torch')
        errors = {
            name: relative_error(a, b)
            for name, a, b in zip(('out', 'grad_q', 'grad_k', 'grad_v', 'grad_power'), tri, ref)
        }
        problems = [name for name, err in errors.items() if not err <= tol]
        extra = {}  # name: (relative error, its bound)
        if case.kind == 'one_sign':  # the kernels hand such calls over: exact as float64
            with torch.no_grad():
                exact = pola_linear_attention(
                    *(t.double() for t in inputs), alpha=case.alpha, eps=eps, backend='torch')
            extra['out_vs_float64'] = (relative_error(tri[0], exact), max(tol, EXACT_BOUND))
        if case.kind == 'padded':
            extra['out_vs_real_keys'] = (relative_error(tri[0], _real_keys_output(inputs,
                                                                                  case)), tol)
        problems += [name for name, (err, bound) in extra.items() if not err <= bound]
        if case.kind == 'strided' and tri[0].stride() != inputs[0].stride():
            problems.append('strides')
            row.details['strides'] = dict(out=tri[0].stride(), q=inputs[0].stride())
        bounds = dict({name: (err, tol) for name, err in errors.items()}, **extra)
        # the value shown: the comparison nearest its bound (a failing one first)
        worst = max(bounds, key=lambda name: _over(*bounds[name]))
        row.value = f'{bounds[worst][0]:.1e} ({worst})'
        row.bound = f'<= {bounds[worst][1]:.1e}'
        row.details.update(
            rel_err={
                k: _json_number(v)
                for k, v in errors.items()
            },
            tol=tol,
            checked_against={
                k: dict(rel_err=_json_number(e), bound=b)
                for k, (e, b) in extra.items()
            })
        if problems:
            row.details['problems'] = problems
            if problems == ['strides']:
                row.value = 'output strides differ from q'
        else:
            row.result = 'PASS'
    except Exception as error:  # noqa: BLE001  (a kernel that does not compile or launch)
        row.value = type(error).__name__
        row.details['error'] = f'{type(error).__name__}: {error}'
    row.seconds = time.perf_counter() - start
    return row


def _over(err: float, bound: float) -> float:
    """How far ``err`` is along to ``bound`` (above 1: past it; NaN counts as past)."""
    return err / bound if err == err else math.inf


def _json_number(x: float):
    return x if math.isfinite(x) else str(x)


def _synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls of ``fn`` after ``warmup`` calls (CUDA
    events on a GPU, the wall clock on a CPU)."""
    for _ in range(warmup):
        fn()
    _synchronize(device)
    times = []
    for _ in range(repeats):
        if device.type == 'cuda':
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _is_oom(error: BaseException) -> bool:
    oom = getattr(torch.cuda, 'OutOfMemoryError', ())
    return (bool(oom) and isinstance(error, oom)) or 'out of memory' in str(error).lower()


def _path_calls(path: str, q: Tensor, k: Tensor, v: Tensor, power: Tensor,
                grad: Tensor) -> Tuple[Callable[[], object], Callable[[], object]]:
    """(forward, forward + backward) of one path: 'triton', 'torch' or 'sdpa'."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, power)]

    def call(*args):
        if path == 'sdpa':
            return F.scaled_dot_product_attention(*args[:3])
        return pola_linear_attention(*args, backend=path)

    def forward():
        with torch.no_grad():
            return call(q, k, v, power)

    def train():
        for t in leaves:
            t.grad = None
        call(*leaves).backward(grad)

    return forward, train


def time_paths(B: int, h: int, N: int, d: int, dtype: torch.dtype, device: torch.device,
               warmup: int, repeats: int, table: Table) -> List[Row]:
    """Time the forward and the forward + backward of the torch path, SDPA and the Triton
    path (q, k, v of (B, h, N, d) in ``dtype``), adding one row per path and mode: the
    median ms, and the ratios to the torch path and to SDPA (a time divided by theirs).
    An out-of-memory error is an 'OOM' row, any other error an 'error' row."""
    g = torch.Generator().manual_seed(N)
    q, k, v, grad = (torch.randn(B, h, N, d, generator=g).to(device, dtype) for _ in range(4))
    power = torch.randn(1, h, 1, d, generator=g).to(device)
    shape = f'{B},{h},{N},{N},{d}'
    rows = []
    for mode in ('fwd', 'fwd+bwd'):
        ms: Dict[str, Optional[float]] = {}
        for path in ('torch', 'sdpa', 'triton'):
            row = Row(f'time {mode}', path, _dtype_name(dtype), shape, 'ok')
            start = time.perf_counter()
            try:
                forward, train = _path_calls(path, q, k, v, power, grad)
                ms[path] = _median_ms(forward if mode == 'fwd' else train, device, warmup, repeats)
                row.value = f'{ms[path]:.3f} ms'
                ratios = [
                    f'{ms[path] / ms[other]:.2f}x {other}' for other in ('torch', 'sdpa')
                    if other != path and ms.get(other)
                ]
                row.bound = ', '.join(ratios)
                row.details = dict(ms=ms[path])
            except Exception as error:  # noqa: BLE001  (OOM at large N, a failing launch)
                ms[path] = None
                row.result = 'OOM' if _is_oom(error) else 'error'
                row.value = type(error).__name__
                row.details = dict(error=f'{type(error).__name__}: {str(error)[:500]}')
                if device.type == 'cuda':
                    torch.cuda.empty_cache()
            row.seconds = time.perf_counter() - start
            rows.append(table.add(row))
    return rows


def environment(device: torch.device) -> dict:
    """Versions, the device and the tolerances, for the header and the JSON file."""
    from ...utils.compat import triton_status
    status = triton_status()
    env = dict(
        python=platform.python_version(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        triton=status.version,
        triton_interpret=interpreting(),
        device=str(device),
        kernels_available=triton_backend.available(),
        kernels_unavailable_reason=triton_backend.unavailable_reason(),
        max_head_dim=triton_backend.MAX_HEAD_DIM,
        tolerances={
            _dtype_name(k): v
            for k, v in triton_backend.TOLERANCES.items()
        },
        allow_tf32=torch.backends.cuda.matmul.allow_tf32,
    )
    if device.type == 'cuda':
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            capability=f'{props.major}.{props.minor}')
    return env


def _failed(row: Row) -> bool:
    """A FAIL row, or an error of the kernels' or the torch path's timing (an error of
    SDPA, e.g. a dtype it does not take, is reported but fails nothing)."""
    return row.result == 'FAIL' or (row.result == 'error' and row.case != 'sdpa')


def summarize(rows: Sequence[Row],
              env: dict,
              quick: bool,
              elapsed_s: float,
              complete: bool = True) -> dict:
    """The JSON form of a run: ``environment``, ``quick``, ``rows``, the counts
    ``passed`` / ``failed`` / ``skipped`` / ``oom``, ``elapsed_s`` and ``verdict``
    ('passed', 'failed', or 'incomplete' while the run goes on)."""
    failed = sum(map(_failed, rows))
    verdict = 'failed' if failed else ('passed' if complete else 'incomplete')
    return dict(
        environment=env,
        quick=quick,
        rows=[r.as_dict() for r in rows],
        passed=sum(r.result == 'PASS' for r in rows),
        failed=failed,
        skipped=sum(r.result == 'SKIP' for r in rows),
        oom=sum(r.result == 'OOM' for r in rows),
        elapsed_s=round(elapsed_s, 1),
        verdict=verdict)


def interpreter_problem() -> Optional[str]:
    """Why Triton's interpreter cannot run the kernels here (no supported Triton, a Triton
    without an interpreter, or one whose interpreter stores nothing with this numpy), or
    None."""
    from ...utils.compat import triton_interpreter_reason
    reason = triton_interpreter_reason()
    if reason is None and triton_backend.kernels is not None:
        reason = triton_backend.kernels.compat.interpreter_problem()
    return reason


def _check_device(device: Optional[str]) -> torch.device:
    """The device of the check (default: 'cpu' under Triton's interpreter, else 'cuda'),
    or a RuntimeError naming why the kernels cannot run there."""
    if device is None:
        device = 'cpu' if interpreting() else 'cuda'
    dev = torch.device(device)
    if dev.type == 'cuda' and not torch.cuda.is_available():
        raise RuntimeError('the kernel check needs a CUDA GPU, and torch sees none')
    if dev.type != 'cuda' and not interpreting():
        raise RuntimeError(f'the kernels run on {dev} tensors only under TRITON_INTERPRET=1')
    return dev


def _write_header(stream: TextIO, env: dict) -> None:
    """The versions, the GPU and the tolerances, above the table."""
    stream.write('kernel check: '
                 + ', '.join(f'{k} {env[k]}'
                             for k in ('python', 'torch', 'triton', 'device', 'triton_interpret')))
    stream.write((f', GPU {env["gpu"]} ({env["gpu_memory_gib"]} GiB, sm {env["capability"]})'
                  if 'gpu' in env else '') + '\n')
    stream.write('tolerances (max |triton - torch| / max |torch|): '
                 + ', '.join(f'{k} {v:.1e}' for k, v in env['tolerances'].items()) + '\n')


def _run_checks(cases, dev: torch.device, table, skip, over_budget) -> None:
    """One row per case: checked, or skipped with the reason (width, dtype, time budget)."""
    for case in cases:
        row = Row('check', case.name, _dtype_name(case.dtype), case.shape, 'SKIP')
        if case.d > triton_backend.MAX_HEAD_DIM:
            skip(row, f'd > {triton_backend.MAX_HEAD_DIM}')
        elif case.dtype not in triton_backend.TOLERANCES:
            skip(row, 'no tolerance')
        elif over_budget():
            skip(row, 'time budget')
        else:
            table.add(check_case(case, dev))


def run_selfcheck(quick: bool = False,
                  device: Optional[str] = None,
                  timing_dtype: torch.dtype = torch.float16,
                  warmup: int = 2,
                  repeats: int = 5,
                  budget_s: float = 165.0,
                  timing: bool = True,
                  json_path: Optional[str] = None,
                  stream: Optional[TextIO] = None) -> dict:
    """Run the checks, then the timings, printing the table to ``stream`` as it goes.

    Args:
        quick (bool): the small cases of :data:`QUICK_CASES` and the tiny timing of
            :data:`QUICK_TIMING_SHAPES` with one repeat (for Triton's interpreter).
        device (str, optional): 'cuda' or 'cpu' (only under ``TRITON_INTERPRET=1``);
            default: 'cpu' when interpreting, else 'cuda'.
        timing_dtype (torch.dtype): the storage dtype of the timed inputs.
        warmup (int): untimed calls before timing (the first one compiles).
        repeats (int): timed calls; the median is reported.
        budget_s (float): rows not begun within this many seconds are SKIP rows.
        timing (bool): whether to time at all.
        json_path (str, optional): written after every row (verdict 'incomplete' until
            the end), so that a run cut short keeps what it measured.
        stream (TextIO, optional): where the table goes (default stdout).

    Returns:
        dict: :func:`summarize` of the run.
    """
    stream = stream if stream is not None else sys.stdout
    dev = _check_device(device)
    if quick:
        warmup, repeats = min(warmup, 1), 1
    start = time.perf_counter()
    env = environment(dev)
    _write_header(stream, env)

    def save(rows: List[Row]) -> None:
        if json_path:
            write_json(
                summarize(rows, env, quick, time.perf_counter() - start, complete=False), json_path)

    stream.write('ratios: the row\'s median ms / the named path\'s (below 1: faster)\n')
    table = Table(stream, on_row=save)

    def skip(row: Row, why: str) -> None:
        row.result, row.value = 'SKIP', why
        table.add(row)

    if not triton_backend.available():
        table.add(
            Row('kernels',
                'load',
                '',
                '',
                'FAIL',
                'not available',
                details=dict(error=triton_backend.unavailable_reason())))
    else:
        table.add(Row('kernels', 'load', '', '', 'PASS', f'Triton {env["triton"]}'))
        over_budget = lambda: time.perf_counter() - start > budget_s
        _run_checks(QUICK_CASES if quick else FULL_CASES, dev, table, skip, over_budget)
        for B, h, N in (QUICK_TIMING_SHAPES if quick else TIMING_SHAPES) if timing else ():
            if over_budget():
                skip(
                    Row('time', 'all paths', _dtype_name(timing_dtype),
                        f'{B},{h},{N},{N},{TIMING_HEAD_DIM}', 'SKIP'), 'time budget')
                continue
            time_paths(B, h, N, TIMING_HEAD_DIM, timing_dtype, dev, warmup, repeats, table)
    result = summarize(table.rows, env, quick, time.perf_counter() - start)
    if json_path:
        write_json(result, json_path)
    stream.write(f'{result["passed"]} passed, {result["failed"]} failed, '
                 f'{result["skipped"]} skipped, {result["oom"]} out of memory '
                 f'in {result["elapsed_s"]} s: {result["verdict"]}\n')
    for row in filter(_failed, table.rows):
        stream.write(f'  {row.row} {row.case}: {row.details.get("error") or row.details}\n')
    stream.flush()
    return result


def write_json(result: dict, path: str) -> None:
    """Write ``result`` of :func:`run_selfcheck` to ``path`` (its folder created), through
    a temporary file, so that the file is always whole (the temporary file is removed
    when the write fails)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f'{path}.tmp'
    try:
        with open(tmp, 'w') as f:
            json.dump(result, f, indent=2, default=str)
            f.write('\n')
        os.replace(tmp, path)
    except BaseException:  # no partial file left behind (a full disk, Ctrl-C)
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
