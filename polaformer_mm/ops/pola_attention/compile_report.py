"""What the fused Triton kernels use on named GPU targets, compiled without a GPU.

Every kernel of :data:`~.triton_kernels.KERNELS` is compiled through Triton's own compile
path (:func:`~.triton_compat.usage_on_target`: ``triton.compile`` of an ``ASTSource`` for a
``GPUTarget`` on Triton 3.x, ``triton.compile(..., cc=)`` on 2.x) once per target, autotune
configuration (:data:`~.triton_kernels.CONFIGS`), storage dtype, torch's ``allow_tf32``
setting and head width, with the compile-time arguments a launch passes
(:func:`~.triton_backend.constants`, :func:`~.triton_backend.dot_precision`). The bundled
``ptxas`` then assembles the PTX with the flags Triton itself uses and says the registers
and spill bytes per thread; Triton's metadata says the shared memory per block. Each
variant is checked against the target's limits and each case (kernel, target, dtype,
precision, head width) gets the configurations the autotuner keeps
(:func:`~.triton_resources.candidates`, the runtime's own prune policy).

The kernels' signatures are the kernels' module's (:func:`~.triton_kernels.signature`).

Needs Triton (2.1 or later) and its bundled ``ptxas``, no GPU; :func:`check_toolchain`
names what is missing. The command line is ``tools/analysis_tools/compile_kernels.py``.
"""
import re
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ...utils.compat import triton_status
from ...utils.processes import pool_context
from .triton_resources import (TARGET_LIMITS, Usage, candidates, limits_of, misfit_reason,
                               parse_ptxas, ptxas_arch)

__all__ = [
    'CompileReportUnavailable', 'DEFAULT_TARGETS', 'DEFAULT_DTYPES', 'DEFAULT_PRECISIONS',
    'DEFAULT_HEAD_DIMS', 'Case', 'Variant', 'CaseSummary', 'Report', 'parse_target', 'ptxas_arch',
    'parse_ptxas', 'check_toolchain', 'kernel_signature', 'compile_variant', 'compile_report',
    'summarize', 'summary_table', 'variant_table', 'config_label'
]

#: Targets compiled by default (compute capabilities: A100, A10/RTX 30xx, L4/RTX 40xx, H100).
DEFAULT_TARGETS = (80, 86, 89, 90)
#: Storage dtypes compiled by default (the ones the kernels take).
DEFAULT_DTYPES = ('float32', 'float16', 'bfloat16')
#: Rows per torch ``allow_tf32`` setting: 'ieee' is False (torch's default), 'tf32' is True.
DEFAULT_PRECISIONS = ('ieee', 'tf32')
#: Head widths compiled by default.
DEFAULT_HEAD_DIMS = (32, 64, 128)

_ALLOW_TF32 = {'ieee': False, 'tf32': True}
_POINTEE = {'float32': 'fp32', 'float16': 'fp16', 'bfloat16': 'bf16'}


class CompileReportUnavailable(RuntimeError):
    """The installed Triton cannot compile the kernels for named targets (it names why)."""


class Case(NamedTuple):
    """One kernel compiled for one target, storage dtype, ``allow_tf32`` setting ('ieee'
    for False, 'tf32' for True), the ``PRECISION`` the runtime picks for them, and head
    width; every autotune configuration of the kernel is a variant of it."""
    kernel: str
    target: int
    dtype: str
    tf32: str
    precision: str
    head_dim: int


class Variant(NamedTuple):
    """One configuration of a :class:`Case` and what it uses (None where its compilation
    failed: then ``error`` says why). ``misfit`` is why it does not fit the target (None
    when it fits); ``candidate`` whether the autotuner keeps it."""
    case: Case
    config_index: int
    config: Dict[str, object]
    num_warps: int
    num_stages: int
    usage: Optional[Usage]
    error: Optional[str]
    misfit: Optional[str]
    candidate: bool

    @property
    def fits(self) -> bool:
        """Compiled and within the target's limits."""
        return self.usage is not None and self.misfit is None

    def as_dict(self) -> dict:
        """The variant as plain JSON data."""
        data = dict(
            self.case._asdict(),
            config_index=self.config_index,
            config=self.config,
            num_warps=self.num_warps,
            num_stages=self.num_stages)
        data.update(self.usage._asdict() if self.usage else dict.fromkeys(Usage._fields))
        data.update(fits=self.fits, misfit=self.misfit, candidate=self.candidate, error=self.error)
        return data


class CaseSummary(NamedTuple):
    """Per case: how many configurations compiled, fit, fit without spilling, failed to
    compile, and the variants the autotuner keeps."""
    case: Case
    configs: int
    fitting: int
    spill_free: int
    errors: int
    candidates: List[Variant]
    variants: List[Variant]

    def as_dict(self) -> dict:
        """The summary as plain JSON data."""
        return dict(
            self.case._asdict(),
            configs=self.configs,
            fitting=self.fitting,
            spill_free_fitting=self.spill_free,
            errors=self.errors,
            candidates=[v.config_index for v in self.candidates])


class Report(NamedTuple):
    """Every variant, and the per-case summaries in the same order."""
    variants: List[Variant]
    summaries: List[CaseSummary]

    def as_dict(self) -> dict:
        """The report as plain JSON data."""
        return dict(
            summary=[s.as_dict() for s in self.summaries],
            variants=[v.as_dict() for v in self.variants])

    @property
    def failed(self) -> List[Variant]:
        """The variants that did not compile."""
        return [v for v in self.variants if v.error is not None]

    @property
    def unfit_cases(self) -> List[CaseSummary]:
        """The cases without a configuration that fits."""
        return [s for s in self.summaries if s.fitting == 0]


def parse_target(target) -> int:
    """The compute capability of ``target`` (``80``, ``'80'``, ``'sm_80'``, ``'sm_90a'``);
    a ValueError names an unknown one and the known targets."""
    match = re.fullmatch(r'(?:sm_?)?(\d+)a?', str(target).strip().lower())
    known = ', '.join(f'sm_{c}' for c in sorted(TARGET_LIMITS))
    if not match:
        raise ValueError(f'bad target {target!r}: give a compute capability such as 80 or '
                         f'sm_80 (known: {known})')
    capability = int(match.group(1))
    limits_of(capability)  # names the known targets when it has no limits
    return capability


def check_toolchain() -> None:
    """Raise :class:`CompileReportUnavailable` naming what is missing: a supported Triton,
    its compiler for named targets and its bundled ``ptxas``
    (:func:`~.triton_compat.target_compile_problem`), and the kernels' module loading
    with it."""
    status = triton_status()
    if not status.usable:
        raise CompileReportUnavailable(f'compile report: {status.reason}')
    from . import triton_backend
    if triton_backend.kernels is None:
        raise CompileReportUnavailable(f'compile report: {triton_backend.unavailable_reason()}')
    problem = triton_backend.kernels.compat.target_compile_problem()
    if problem:
        raise CompileReportUnavailable(f'compile report: {problem}')


def _kernels_module():
    from . import triton_backend
    return triton_backend.kernels


def _jit_function(kernel):
    """The ``triton.jit`` function under an autotuner or heuristics wrapper."""
    from triton.runtime.jit import JITFunction
    fn = kernel
    while not isinstance(fn, JITFunction):
        if not hasattr(fn, 'fn'):
            raise TypeError(f'{kernel!r} wraps no triton.jit function')
        fn = fn.fn
    return fn


def kernel_signature(name: str, dtype: str, constexprs: Dict[str, object]) -> Dict[str, str]:
    """Triton's signature of kernel ``name`` for storage ``dtype`` ('float32', 'float16'
    or 'bfloat16').

    The kernels' module says it (:func:`~.triton_kernels.signature`); this checks its
    tables against the kernel's JIT parameters. ``constexprs`` must give every
    compile-time parameter.
    """
    if dtype not in _POINTEE:
        raise ValueError(f'unknown storage dtype {dtype!r} (known: {", ".join(_POINTEE)})')
    module = _kernels_module()
    fn = _jit_function(module.KERNELS[name])
    params = [p.name for p in module.compat.parameters(fn)]
    storage = set(module.STORAGE_ARGS.get(name, ()))
    unknown = storage.difference(params)
    if unknown:
        raise ValueError(f'STORAGE_ARGS[{name!r}] names {sorted(unknown)}, which are not '
                         f'parameters of the kernel ({", ".join(params)})')
    missing = [
        p.name for p in module.compat.parameters(fn) if p.is_constexpr and p.name not in constexprs
    ]
    if missing:
        raise ValueError(f'kernel {name!r}: no value for its constexprs {", ".join(missing)}')
    return dict(module.signature(name, _POINTEE[dtype]))


def _short_error(error: BaseException) -> str:
    text = ' '.join(str(error).split())
    return f'{type(error).__name__}: {text[:600]}'


def compile_variant(spec: Tuple[str, int, str, str, int, int]) -> dict:
    """Compile one variant and read what it uses; the work of one pool process.

    Args:
        spec: (kernel name, compute capability, storage dtype, PRECISION, head width,
            index of the configuration in the kernel's CONFIGS).

    Returns:
        dict: ``usage`` (the fields of :class:`~.triton_resources.Usage`) and ``error``
        (None, or why it did not compile or assemble; then ``usage`` is None).
    """
    name, capability, dtype, precision, head_dim, index = spec
    try:
        from . import triton_backend
        module = _kernels_module()
        config = module.CONFIGS[name][index]
        constexprs = dict(triton_backend.constants(head_dim, precision), **config.kwargs)
        usage = module.compat.usage_on_target(
            _jit_function(module.KERNELS[name]), kernel_signature(name, dtype, constexprs),
            constexprs, capability, config.num_warps, config.num_stages)
        return dict(usage=usage._asdict(), error=None)
    except Exception as error:  # noqa: BLE001  (any failure is the variant's error row)
        return dict(usage=None, error=_short_error(error))


def config_label(variant: Variant) -> str:
    """A configuration in short: its keyword arguments, warps and stages
    (``BLOCK_N=64 w4 s2``)."""
    kwargs = ' '.join(f'{k}={v}' for k, v in variant.config.items())
    return f'{kwargs} w{variant.num_warps} s{variant.num_stages}'.strip()


def summarize(variants: Sequence[Variant]) -> Tuple[List[Variant], List[CaseSummary]]:
    """Mark each variant's fit and candidacy and summarise per case, in first-seen order.

    Args:
        variants: compiled variants (``misfit`` and ``candidate`` are recomputed here).

    Returns:
        the variants with ``misfit`` and ``candidate`` set, and the per-case summaries.
    """
    by_case: Dict[Case, List[Variant]] = {}
    for variant in variants:
        by_case.setdefault(variant.case, []).append(variant)
    marked, summaries = [], []
    for case, group in by_case.items():
        limits = limits_of(case.target)
        group = [
            v._replace(misfit=misfit_reason(v.usage, limits) if v.usage else None) for v in group
        ]
        # a variant that did not compile has no usage to prune by: the autotuner's launch
        # would fail on it, so it is no candidate here
        compiled = [(v.config_index, v.usage) for v in group if v.usage is not None]
        kept = set(candidates(compiled, limits))
        group = [v._replace(candidate=v.config_index in kept) for v in group]
        marked += group
        summaries.append(
            CaseSummary(
                case=case,
                configs=len(group),
                fitting=sum(v.fits for v in group),
                spill_free=sum(v.fits and v.usage.spill_stores == 0 for v in group),
                errors=sum(v.error is not None for v in group),
                candidates=[v for v in group if v.candidate],
                variants=group))
    return marked, summaries


def _cases(kernels: Iterable[str], targets: Iterable[int], dtypes: Iterable[str],
           precisions: Iterable[str], head_dims: Iterable[int]) -> List[Case]:
    import torch

    from . import triton_backend
    cases = []
    for name in kernels:
        for target in targets:
            for dtype in dtypes:
                for tf32 in precisions:
                    precision = triton_backend.dot_precision(
                        getattr(torch, dtype), _ALLOW_TF32[tf32])
                    for head_dim in head_dims:
                        cases.append(Case(name, target, dtype, tf32, precision, head_dim))
    return cases


def _check_choices(what: str, given: Sequence, known: Sequence) -> None:
    bad = [x for x in given if x not in known]
    if bad:
        raise ValueError(f'unknown {what} {", ".join(map(str, bad))} '
                         f'(known: {", ".join(map(str, known))})')


def compile_report(targets: Sequence = DEFAULT_TARGETS,
                   dtypes: Sequence[str] = DEFAULT_DTYPES,
                   precisions: Sequence[str] = DEFAULT_PRECISIONS,
                   head_dims: Sequence[int] = DEFAULT_HEAD_DIMS,
                   kernels: Optional[Sequence[str]] = None,
                   configs: Optional[Sequence[int]] = None,
                   jobs: int = 1,
                   progress: Optional[Callable[[int, int], None]] = None) -> Report:
    """Compile every variant and summarise it per case.

    Args:
        targets: compute capabilities or names (``80``, ``'sm_80'``).
        dtypes: storage dtypes ('float32', 'float16', 'bfloat16').
        precisions: torch ``allow_tf32`` settings, 'ieee' (False) and/or 'tf32' (True).
        head_dims: head widths (1 to ``triton_backend.MAX_HEAD_DIM``).
        kernels: names of :data:`~.triton_kernels.KERNELS` (default: all).
        configs: indices into each kernel's CONFIGS (default: all).
        jobs: compiler processes (one to a few seconds per variant each).
        progress: called with (compilations done, compilations in all) after each one.

    Returns:
        Report: the variants (a variant that failed to compile has its ``error``) and the
        per-case summaries.
    """
    check_toolchain()
    from . import triton_backend
    module = _kernels_module()
    targets = [parse_target(t) for t in targets]
    names = list(module.KERNELS) if kernels is None else list(kernels)
    _check_choices('kernel', names, list(module.KERNELS))
    _check_choices('dtype', dtypes, DEFAULT_DTYPES)
    _check_choices('precision', precisions, DEFAULT_PRECISIONS)
    bad_dims = [d for d in head_dims if not 1 <= int(d) <= triton_backend.MAX_HEAD_DIM]
    if bad_dims:
        raise ValueError(f'head widths {bad_dims} outside 1..{triton_backend.MAX_HEAD_DIM}')
    if jobs < 1:
        raise ValueError(f'jobs must be at least 1 (got {jobs})')

    variants, specs = [], []
    for case in _cases(names, targets, dtypes, precisions, [int(d) for d in head_dims]):
        all_configs = module.CONFIGS[case.kernel]
        indices = range(len(all_configs)) if configs is None else configs
        for index in indices:
            if not 0 <= index < len(all_configs):
                raise ValueError(f'kernel {case.kernel!r} has configurations '
                                 f'0..{len(all_configs) - 1} (got {index})')
            config = all_configs[index]
            variants.append(
                Variant(case, index, dict(config.kwargs), config.num_warps, config.num_stages, None,
                        None, None, False))
            specs.append(
                (case.kernel, case.target, case.dtype, case.precision, case.head_dim, index))
    # the same compilation (e.g. two allow_tf32 settings mapped to one PRECISION) runs once
    unique = list(dict.fromkeys(specs))
    results = []
    if jobs == 1 or len(unique) == 1:
        for spec in unique:
            results.append(compile_variant(spec))
            if progress:
                progress(len(results), len(unique))
    else:
        # forked workers (where safe) import torch and Triton no second time; nothing here
        # has touched a GPU or compiled yet
        with ProcessPoolExecutor(min(jobs, len(unique)), mp_context=pool_context()) as pool:
            for result in pool.map(compile_variant, unique, chunksize=1):
                results.append(result)
                if progress:
                    progress(len(results), len(unique))
    by_spec = dict(zip(unique, results))
    variants = [
        v._replace(
            usage=Usage(**by_spec[s]['usage']) if by_spec[s]['usage'] else None,
            error=by_spec[s]['error']) for v, s in zip(variants, specs)
    ]
    return Report(*summarize(variants))


def _span(values: List[int], scale: float = 1.0) -> str:
    """``low-high`` of ``values`` (divided by ``scale``), one number if equal, '-' if none."""
    if not values:
        return '-'
    low, high = (f'{x / scale:.1f}' if scale != 1.0 else str(x) for x in (min(values), max(values)))
    return low if low == high else f'{low}-{high}'


def _precision(case: Case) -> str:
    """The row's allow_tf32 label, and the PRECISION the runtime uses when it differs."""
    return case.tf32 if case.tf32 == case.precision else f'{case.tf32} ({case.precision})'


def summary_table(report: Report) -> str:
    """Per case one Markdown row: configurations that fit / fit without spills / compiled,
    the registers and shared memory of the autotuner's candidates, the largest spill
    stores of any configuration, and the candidates."""
    lines = [
        '| kernel | target | dtype | allow_tf32 | d | fit / spill-free / configs | '
        'candidates: registers | candidates: shared KiB | max spill stores B | candidates |',
        '|---|---|---|---|---:|---:|---:|---:|---:|---|',
    ]
    for s in report.summaries:
        c = s.case
        compiled = [v.usage for v in s.variants if v.usage is not None]
        max_spill = str(max(u.spill_stores for u in compiled)) if compiled else '-'
        counts = f'{s.fitting} / {s.spill_free} / {s.configs}'
        if s.errors:
            counts += f' ({s.errors} failed)'
        chosen = [v.usage for v in s.candidates]
        labels = '; '.join(config_label(v) for v in s.candidates) or 'none'
        lines.append(f'| {c.kernel} | sm_{c.target} | {c.dtype} | {_precision(c)} | '
                     f'{c.head_dim} | {counts} | {_span([u.registers for u in chosen])} | '
                     f'{_span([u.shared for u in chosen], 1024.0)} | {max_spill} | {labels} |')
    return '\n'.join(lines)


def variant_table(report: Report) -> str:
    """Per variant one Markdown row: its case and configuration, registers, spill bytes,
    shared memory, whether it fits (or why not), whether the autotuner keeps it, and its
    compile error."""
    lines = [
        '| kernel | target | dtype | allow_tf32 | d | config | registers | spill stores B | '
        'spill loads B | shared B | fits | candidate | error |',
        '|---|---|---|---|---:|---|---:|---:|---:|---:|---|---|---|',
    ]
    for v in report.variants:
        c, u = v.case, v.usage
        usage = (f'{u.registers} | {u.spill_stores} | {u.spill_loads} | {u.shared}'
                 if u else '- | - | - | -')
        fits = 'yes' if v.fits else ('-' if u is None else f'no: {v.misfit}')
        error = (v.error or '').replace('|', '\\|')
        lines.append(f'| {c.kernel} | sm_{c.target} | {c.dtype} | {_precision(c)} | '
                     f'{c.head_dim} | {config_label(v)} | {usage} | {fits} | '
                     f'{"yes" if v.candidate else "no"} | {error} |')
    return '\n'.join(lines)
