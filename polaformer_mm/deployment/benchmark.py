"""onnxruntime (CPU) against PyTorch eager, config by config: the rows of
``tools/analysis_tools/benchmark_onnx.py``.

:func:`benchmark_run` exports one part of a config (:func:`~.export.export_onnx` for
``backbone`` / ``tensor``, :func:`~.end2end.export_end2end` for ``end2end``) at the first
opset of ``opsets`` that has every operator of the model (the softmax baselines of mmdet
need opset 13 or later for ``aten::unflatten``; the Pola models take mmdeploy's 11) and
times both runtimes on it (:func:`~.checks.runners`, :func:`~.checks.end2end_runners`).
Its two steps, :func:`prepare_run` (the export) and :func:`time_prepared` (the timing),
let a table time all its rows in rounds, so that the ratios between rows hold on a
machine whose speed drifts. A run that fails for any other reason gives a row with the
reason instead of times, so that one bad config does not stop a table.
:func:`format_markdown` and :func:`write_json` write the table, :func:`exit_code` is the
command line's exit status (1 when no row was timed), :func:`count_flops` and
:func:`matmul_peak` give the roofline columns (``--roofline``: the rows' counted FLOPs
over their onnxruntime times, against this machine's float32 matrix-product rate in
onnxruntime), :func:`cpu_description`
names the processor the times were taken on (which runtime is faster depends on it), and
:func:`quiet_model_logs` keeps mmengine's model logs (every module's ``init_weights``
line) and the exporters' warnings off the terminal.
"""
import contextlib
import io
import json
import logging
import os
import os.path as osp
import platform
import sys
import warnings
from functools import partial
from typing import Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    'PARTS', 'OPSETS', 'BenchmarkRow', 'benchmark_run', 'format_markdown', 'write_json',
    'quiet_model_logs', 'missing_operator_opset', 'cpu_description', 'PreparedRun', 'prepare_run',
    'time_prepared', 'exit_code', 'PEAK_SIZE', 'count_flops', 'matmul_peak', 'with_flops',
    'peak_fraction', 'onnx_file_name', 'add_run_arguments'
]

#: What a run exports: the backbone's stage maps, the tensor part of the model, or the
#: whole model with its post-processing (mmdeploy).
PARTS = ('backbone', 'tensor', 'end2end')
#: The opsets tried in turn when an export misses an operator.
OPSETS = (11, 13, 17)
#: The side of the square float32 matrices whose product measures the peak.
PEAK_SIZE = 1024


class BenchmarkRow(NamedTuple):
    """One timed (or failed) export."""
    config: str  #: the config file's name
    part: str  #: one of :data:`PARTS`
    what: str  #: what the graph computes (the model's class and outputs)
    height: int  #: input height
    width: int  #: input width
    opset: Optional[int]  #: the opset of the graph (None: failed)
    torch_s: Optional[float]  #: median seconds, PyTorch eager
    onnxruntime_s: Optional[float]  #: median seconds, onnxruntime
    error: Optional[str] = None  #: why the run gave no times
    #: multiply-adds of the timed part (:func:`count_flops`; None: not counted)
    flops: Optional[float] = None
    flops_error: Optional[str] = None  #: why the FLOPs were not counted

    @property
    def ratio(self) -> Optional[float]:
        """PyTorch / onnxruntime (> 1: onnxruntime is faster)."""
        if self.torch_s is None or not self.onnxruntime_s:
            return None
        return self.torch_s / self.onnxruntime_s

    @property
    def flops_per_s(self) -> Optional[float]:
        """The rate onnxruntime ran the part at, FLOP/s: two FLOPs (a multiply and an add)
        per counted multiply-add over the median onnxruntime time (None: no FLOPs or
        time)."""
        if self.flops is None or not self.onnxruntime_s:
            return None
        return 2 * self.flops / self.onnxruntime_s


#: Vector extensions, widest first, as /proc/cpuinfo flags them (x86 ``flags``, Arm
#: ``Features``), with the name printed for each.
_VECTOR_EXTENSIONS = (('avx512f', 'AVX-512'), ('avx2', 'AVX2'), ('avx', 'AVX'),
                      ('sse4_2', 'SSE4.2'), ('sve', 'SVE'), ('asimd', 'NEON'))


def cpu_description(cpuinfo: Optional[str] = None) -> str:
    """The processor's model and its widest vector extension, e.g. ``'AMD EPYC, AVX-512'``.

    Read from ``cpuinfo`` (default: the text of ``/proc/cpuinfo`` where there is one): the
    first ``model name`` (x86) or ``Model`` / ``Hardware`` line (Arm), and the widest of
    :data:`_VECTOR_EXTENSIONS` among the first ``flags`` / ``Features`` line. Elsewhere
    (macOS, Windows) ``platform.processor()``, then ``platform.machine()``, then ``'?'``.
    """
    if cpuinfo is None:
        try:
            with open('/proc/cpuinfo') as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ''
    fields = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(':')
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    model = next((fields[k] for k in ('model name', 'model', 'hardware') if fields.get(k)), '')
    model = model or platform.processor() or platform.machine() or '?'
    flags = set((fields.get('flags') or fields.get('features') or '').split())
    widest = next((name for flag, name in _VECTOR_EXTENSIONS if flag in flags), None)
    return f'{model}, {widest}' if widest else model


def missing_operator_opset(error: BaseException) -> bool:
    """Whether ``error`` says an operator is not in the export's opset (the exporter's
    ``UnsupportedOperatorError`` or a symbolic that needs a later opset)."""
    text = f'{type(error).__name__}: {error}'
    return ('UnsupportedOperatorError' in text or 'opset version' in text
            or 'opset_version' in text)


@contextlib.contextmanager
def quiet_model_logs(level: int = logging.WARNING) -> Iterator[None]:
    """mmengine's current logger at ``level`` and Python warnings off within the block
    (the model's ``init_weights`` lines, tracer and exporter warnings); both put back on
    exit."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    previous = logger.level
    logger.setLevel(level)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            yield
    finally:
        logger.setLevel(previous)


@contextlib.contextmanager
def _output_discarded() -> Iterator[None]:
    """Whatever the block prints, from Python or from C++ (the TorchScript exporter
    prints the whole graph of a failed export to the process's stderr), is dropped."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, 'w') as null, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def _export(config: str, part: str, shape, path: str, opset: int,
            block_mlps: bool) -> Tuple[str, Callable[[Optional[int]], Tuple[Callable, Callable]]]:
    """Export one part at ``opset``: (what the graph computes, what makes the two calls to
    time for a number of onnxruntime threads)."""
    from .checks import end2end_runners, runners
    from .end2end import export_end2end, random_images
    from .export import build_exportable, export_onnx
    if part == 'end2end':
        export = export_end2end(config, None, path, shape, opset=opset, block_mlps=block_mlps)
        image = random_images(1, shape)[0]
        return (f'{type(export.model).__name__} end to end ({export.task})',
                lambda threads: end2end_runners(export, image, shape, threads))
    module, _ = build_exportable(config, None, 'backbone' if part == 'backbone' else 'model')
    export_onnx(module, path, shape, opset=opset, block_mlps=block_mlps)
    return module.description, lambda threads: runners(module, path, shape, threads=threads)


def _reason(error: BaseException) -> str:
    """The error's type and first line, for a row."""
    return f'{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ""}'


def onnx_file_name(config: str, part: str, shape: Sequence[int], opset: int) -> str:
    """The name of the file :func:`prepare_run` exports ``part`` of ``config`` to at
    ``shape`` (H, W) and ``opset``."""
    H, W = (int(s) for s in shape)
    return f'{osp.splitext(osp.basename(config))[0]}_{part}_{H}x{W}_opset{opset}.onnx'


class PreparedRun(NamedTuple):
    """One exported part of a config, not yet timed."""
    row: BenchmarkRow  #: the row without times (or with the reason its export failed)
    #: makes the two calls to time, PyTorch eager and onnxruntime (a new session); None
    #: when the export failed
    make_runners: Optional[Callable[[], Tuple[Callable, Callable]]]


def prepare_run(config: str,
                part: str,
                shape: Sequence[int],
                folder: str,
                opsets: Sequence[int] = OPSETS,
                threads: Optional[int] = None,
                block_mlps: bool = True) -> PreparedRun:
    """Export ``part`` of ``config`` (initial weights: the speed does not depend on them)
    to ``folder`` at the first of ``opsets`` with every operator of the model; the other
    arguments are those of :func:`benchmark_run`. Any failure gives a row whose
    ``error`` says what failed."""
    if part not in PARTS:
        raise ValueError(f'part must be one of {PARTS}, got {part!r}')
    H, W = (int(s) for s in shape)
    name = osp.basename(config)
    error = None
    for opset in opsets:
        path = osp.join(folder, onnx_file_name(config, part, (H, W), opset))
        try:
            with _output_discarded():
                what, make_runners = _export(config, part, (H, W), path, opset, block_mlps)
        except Exception as err:  # noqa: B902 -- every failure becomes the row's reason
            error = _reason(err)
            if missing_operator_opset(err):
                continue
            return PreparedRun(BenchmarkRow(name, part, '', H, W, None, None, None, error), None)
        return PreparedRun(
            BenchmarkRow(name, part, what, H, W, opset, None, None), partial(make_runners, threads))
    return PreparedRun(
        BenchmarkRow(name, part, '', H, W, None, None, None,
                     f'no opset of {tuple(opsets)} exports it ({error})'), None)


def time_prepared(prepared: Sequence[PreparedRun],
                  repeats: int = 10,
                  warmup: int = 2,
                  rounds: int = 1,
                  progress: Optional[Callable[[int], None]] = None) -> List[BenchmarkRow]:
    """Time the prepared runs in ``rounds`` rounds over all of them: every run's two calls
    are made once (one onnxruntime session, kept for all rounds, so that no round pays
    for a new session's first allocations, and released after the last), and in each
    round timed ``repeats`` times each, PyTorch's first, each after ``warmup`` untimed
    calls (the two are not interleaved call by call: each runtime's worker threads keep
    spinning for a while after a call and would slow the other's next one). A row's
    times are the medians of all its rounds' calls. Rounds spread every row over the
    whole measurement, so that a machine whose speed drifts moves every row alike and the
    ratios between rows hold. A run that fails gives its row the reason. ``progress(r)``
    is called before round r (1-based)."""
    from .checks import run_seconds
    seconds: List[List[List[float]]] = [[[], []] for _ in prepared]
    errors = [p.row.error for p in prepared]
    calls: List[Optional[Tuple[Callable, Callable]]] = [None] * len(prepared)
    for r in range(rounds):
        if progress is not None:
            progress(r + 1)
        for i, run in enumerate(prepared):
            if errors[i] is not None or run.make_runners is None:
                continue
            try:
                with _output_discarded():
                    calls[i] = calls[i] or run.make_runners()
                    times = [run_seconds(call, repeats, warmup) for call in calls[i]]
            except Exception as err:  # noqa: B902 -- every failure becomes the row's reason
                errors[i], calls[i] = _reason(err), None
                continue
            for kept, new in zip(seconds[i], times):
                kept.extend(new)
            if r == rounds - 1:
                calls[i] = None  # the session's memory goes before the next row's runs
    rows = []
    for run, (torch_s, onnxruntime_s), error in zip(prepared, seconds, errors):
        if error is not None or run.make_runners is None:
            rows.append(run.row._replace(error=error))
        else:
            rows.append(
                run.row._replace(
                    torch_s=float(np.median(torch_s)),
                    onnxruntime_s=float(np.median(onnxruntime_s))))
    return rows


def benchmark_run(config: str,
                  part: str,
                  shape: Sequence[int],
                  folder: str,
                  repeats: int = 10,
                  warmup: int = 2,
                  opsets: Sequence[int] = OPSETS,
                  threads: Optional[int] = None,
                  block_mlps: bool = True) -> BenchmarkRow:
    """Export ``part`` of ``config`` (initial weights: the speed does not depend on them)
    to ``folder`` at the first of ``opsets`` with every operator of the model, and time
    PyTorch eager and onnxruntime on one (1, 3, H, W) image: medians of ``repeats`` runs
    of each after ``warmup`` untimed ones. ``threads``: onnxruntime's intra-op
    threads (None: its default). ``block_mlps``: the exports' MLP rewrite
    (:func:`~.blocked_mlp.block_mlps`; False: the graph as traced). Any failure gives a
    row whose ``error`` says what failed. :func:`prepare_run` and :func:`time_prepared`
    are its two steps, for timing many runs in rounds."""
    prepared = prepare_run(config, part, shape, folder, opsets, threads, block_mlps)
    return time_prepared([prepared], repeats, warmup)[0]


def peak_fraction(row: BenchmarkRow, peak: float) -> Optional[float]:
    """The row's onnxruntime rate (:attr:`BenchmarkRow.flops_per_s`) over ``peak``
    (FLOP/s, :func:`matmul_peak`); None when the row has no rate."""
    rate = row.flops_per_s
    return None if rate is None else rate / peak


def _roofline_cells(row: BenchmarkRow, peak: float) -> str:
    """The three roofline cells of a timed row: FLOPs (G), GFLOP/s, fraction of ``peak``."""
    if row.flops is None:
        why = (row.flops_error or 'not counted').replace('|', '/')
        return f' not counted: {why} | | |'
    return (f' {row.flops / 1e9:.2f} | {row.flops_per_s / 1e9:.1f} | '
            f'{peak_fraction(row, peak):.1%} |')


def format_markdown(rows: Sequence[BenchmarkRow], peak: Optional[float] = None) -> str:
    """The Markdown table of the rows (failed ones say why in place of the times); with
    ``peak`` (FLOP/s, :func:`matmul_peak`) three roofline columns more: the counted
    FLOPs (G multiply-adds), the onnxruntime rate (GFLOP/s, two per multiply-add) and its
    fraction of ``peak``, and a last line naming the peak."""
    extra = ' FLOPs (G) | onnxruntime GFLOP/s | of peak |' if peak else ''
    lines = [
        '| config | exported | input | opset | PyTorch eager (ms) | onnxruntime (ms) | '
        f'PyTorch / onnxruntime |{extra}', '|---|---|---|---|---|---|---|' + '---|' *
        (3 * bool(peak))
    ]
    for r in rows:
        head = f'| {r.config} | {r.what or r.part} | {r.height}x{r.width} | {r.opset or "-"} |'
        if r.error is not None:
            lines.append(f'{head} failed: {r.error.replace("|", "/")} | | |'
                         + ' |' * (3 * bool(peak)))
        else:
            lines.append(f'{head} {r.torch_s * 1e3:.1f} | {r.onnxruntime_s * 1e3:.1f} | '
                         f'{r.ratio:.2f}x |' + (_roofline_cells(r, peak) if peak else ''))
    if peak:
        lines.append(f'\nfloat32 matrix-product peak in onnxruntime: {peak / 1e9:.1f} GFLOP/s '
                     f'({PEAK_SIZE}x{PEAK_SIZE} MatMul, the rows\' threads; '
                     f'FLOPs: multiply-adds, as the FLOPs counter counts them; the rates '
                     f'count two FLOPs per multiply-add, as the peak does)')
    return '\n'.join(lines)


def exit_code(rows: Sequence[BenchmarkRow]) -> int:
    """The command line's exit status: 1 when no row has times (every export or run
    failed: the table holds nothing but reasons), else 0."""
    return 0 if any(r.error is None and r.torch_s is not None for r in rows) else 1


def write_json(path: str,
               rows: Sequence[BenchmarkRow],
               env: dict,
               peak: Optional[float] = None) -> None:
    """The rows (seconds; ``ratio`` PyTorch / onnxruntime) and ``env`` (versions,
    threads, load, command) as JSON; with ``peak`` (FLOP/s, :func:`matmul_peak`, kept in
    ``env`` as ``peak_flops_per_s``) every row has its ``flops_per_s`` and ``of_peak``
    too."""
    data = dict(env=env, rows=[dict(r._asdict(), ratio=r.ratio) for r in rows])
    if peak:
        data['env'] = dict(env, peak_flops_per_s=peak)
        for row, r in zip(data['rows'], rows):
            row.update(flops_per_s=r.flops_per_s, of_peak=peak_fraction(r, peak))
    with open(path, 'w') as f:
        json.dump(data, f, indent=2)
        f.write('\n')


def count_flops(config: str, part: str, shape: Sequence[int]) -> float:
    """The multiply-adds of ``part`` of ``config`` on one (1, 3, H, W) image, counted by
    :func:`polaformer_mm.analysis.flops.measure_configs` as
    ``tools/analysis_tools/get_flops.py`` counts them: the backbone (``'backbone'``) or
    the tensor-only forward (``'tensor'``, ``--whole-model``). ``'end2end'`` (the
    post-processing has no count) and an mmdet config's ``'tensor'`` (the counter's
    whole model is backbone + neck, the exported tensor part also has the RPN head) are
    ValueErrors naming the reason."""
    from ..analysis.flops import measure_configs
    if part not in ('backbone', 'tensor'):
        raise ValueError(f'FLOPs are counted for the backbone and tensor parts, not {part!r} '
                         '(the post-processing has no count)')
    row = measure_configs([config], tuple(int(s) for s in shape), part == 'tensor')[0]
    if part == 'tensor' and row['part'] != 'model':
        raise ValueError(f'the counter measures {row["part"]} of this config, the exported '
                         'tensor part is more (the RPN head)')
    return float(row['flops'])


def with_flops(rows: Sequence[BenchmarkRow], configs: Sequence[str]) -> List[BenchmarkRow]:
    """The rows with their :func:`count_flops` (``configs``: each row's config file, in
    order); a timed row whose count fails gets the reason in ``flops_error``, a failed
    row stays as it is."""
    counted = []
    for row, config in zip(rows, configs):
        if row.error is None:
            try:
                with _output_discarded():
                    row = row._replace(flops=count_flops(config, row.part, (row.height, row.width)))
            except Exception as err:  # noqa: B902 -- the row keeps its times
                row = row._replace(flops_error=_reason(err))
        counted.append(row)
    return counted


def matmul_peak(threads: Optional[int] = None,
                size: int = PEAK_SIZE,
                repeats: int = 5,
                warmup: int = 2) -> float:
    """This machine's float32 matrix-product rate in onnxruntime, FLOP/s: a one-node
    ``MatMul`` graph of two (``size``, ``size``) float32 inputs, in a CPU session with the
    options the rows' sessions have (``threads`` intra-op threads; None: onnxruntime's
    default), 2 size^3 FLOPs (a multiply and an add per term) over the median of
    ``repeats`` runs after ``warmup`` untimed ones."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from .checks import median_seconds
    if size < 1 or repeats < 1:
        raise ValueError(f'size and repeats must be >= 1, got {size} and {repeats}')
    a, b, c = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [size, size]) for n in 'abc')
    graph = helper.make_graph([helper.make_node('MatMul', ['a', 'b'], ['c'])], 'matmul_peak',
                              [a, b], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 13)])
    model.ir_version = 7  # opset 13's, which every onnxruntime of the stacks reads
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=['CPUExecutionProvider'])
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal((size, size), dtype=np.float32) for n in 'ab'}
    return 2 * size**3 / median_seconds(lambda: session.run(None, feed), repeats, warmup)


def add_run_arguments(parser, work_dir_holds: str, markdown: str, rows: str) -> None:
    """Add the options ``benchmark_onnx.py`` and ``profile_onnx.py`` share to ``parser``
    (an ``argparse.ArgumentParser``): ``--opsets`` and ``--threads`` of the exports and
    sessions, and the outputs ``--work-dir`` (holding ``work_dir_holds``), ``--out-md``
    (``markdown``) and ``--out-json`` (``rows``); their checks:
    :func:`polaformer_mm.utils.output_paths.check_run_options`."""
    parser.add_argument(
        '--opsets',
        type=int,
        nargs='+',
        default=list(OPSETS),
        help='opsets tried in turn when an export misses an operator (default: 11 13 17)')
    parser.add_argument(
        '--threads',
        type=int,
        default=None,
        help="onnxruntime's intra-op threads (default: PyTorch's thread count)")
    parser.add_argument(
        '--work-dir',
        default=None,
        help=f'where {work_dir_holds} go, made if missing (default: a temporary folder)')
    parser.add_argument(
        '--out-md', default=None, help=f'write {markdown} (Markdown) here (its folder must exist)')
    parser.add_argument(
        '--out-json', default=None, help=f'write {rows} (JSON) here (its folder must exist)')
