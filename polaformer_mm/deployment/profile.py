"""Where an exported model's time goes in onnxruntime (CPU): the profiles of
``tools/analysis_tools/profile_onnx.py``.

:func:`profile_run` exports one part of a config as ``tools/analysis_tools/benchmark_onnx.py``
exports it (:func:`~.benchmark.prepare_run`: the first opset that has every operator of the
model, the MLPs over blocks of tokens) and runs it in an onnxruntime session with profiling
on: one warm-up run, then ``runs`` timed runs of a (1, 3, H, W) float32 random input.
:func:`node_times` reads the trace onnxruntime writes (:func:`load_trace`): every node's
kernel events, split into one group per run (the nodes of a ``Scan`` body run several
times per run), the node's time being its fastest run after the warm-up (robust to a
noisy machine). ``Scan`` nodes are left out of every sum: their time is their body's
nodes', which the trace reports one by one. :func:`summarize` sums the nodes by op type
and by model part (:func:`node_part`: the stage and the kind, ``attention``, ``mlp``,
``norm`` or ``other``, read from the exporter's scope names; a node onnxruntime made
without one, a fused ``Gelu`` or a layout reorder, takes the part of the node run before
it), and the attention's time
split into its products (:data:`PRODUCT_OPS`) and its elementwise and layout nodes (the
rest). :func:`format_markdown`, :func:`compare_pairs` and :func:`write_json` write the
report.

Profiling adds a little time to every node, so that the sums exceed the times of
unprofiled runs: this says where the time goes, ``benchmark_onnx.py`` how long it takes.
"""
import json
import os.path as osp
import re
import time
from collections import defaultdict
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .benchmark import OPSETS, onnx_file_name, prepare_run

__all__ = [
    'PRODUCT_OPS', 'KINDS', 'NodeTime', 'Profile', 'group_fastest', 'load_trace', 'node_times',
    'exported_name', 'node_part', 'is_product', 'summarize', 'profile_session', 'profile_run',
    'format_markdown', 'compare_pairs', 'write_json'
]

#: The op types of the products (matrix products and convolutions, onnxruntime's fused
#: forms with them); every other node is elementwise or layout work.
PRODUCT_OPS = ('MatMul', 'FusedMatMul', 'Gemm', 'Conv', 'FusedConv', 'NchwcConv', 'FusedGemm',
               'MatMulInteger', 'QLinearConv', 'QLinearMatMul')
#: The kinds of model part a node belongs to, in the order of the tables.
KINDS = ('attention', 'mlp', 'norm', 'other')
#: The suffix of onnxruntime's kernel events.
_KERNEL = '_kernel_time'
#: What onnxruntime appends to the names of the nodes it rewrites.
_RENAMED = ('/MatmulTransposeFusion/', '_output_0_nchwc')
_STAGE = re.compile(r'(?:layers|stages)\.(\d+)')
_BLOCKED = re.compile(r'/blocked_mlp\d+/')


class NodeTime(NamedTuple):
    """One node of the profiled graph."""
    name: str  #: the node's name in onnxruntime's trace
    op: str  #: its op type
    ms: float  #: its time in the fastest run, milliseconds
    stage: str  #: the stage it belongs to ('-': none)
    kind: str  #: one of :data:`KINDS`


class Profile(NamedTuple):
    """The profile of one exported part (or the reason there is none)."""
    config: str  #: the config file's name
    part: str  #: 'backbone' or 'tensor'
    what: str  #: what the graph computes
    height: int  #: input height
    width: int  #: input width
    opset: Optional[int]  #: the graph's opset (None: failed)
    wall_ms: Optional[float] = None  #: median wall time of the profiled runs, ms
    nodes: Tuple[NodeTime, ...] = ()  #: every node but the Scan nodes
    error: Optional[str] = None  #: why there is no profile


def group_fastest(durations: Sequence[float], runs: int) -> float:
    """The smallest sum of ``durations`` over ``runs + 1`` equal consecutive groups (one per
    run, the first the warm-up), the first group left out. A count that does not split
    evenly is a ValueError (the trace misses events)."""
    if runs < 1:
        raise ValueError(f'runs must be >= 1, got {runs}')
    if not durations or len(durations) % (runs + 1):
        raise ValueError(f'{len(durations)} events do not split into {runs + 1} runs')
    size = len(durations) // (runs + 1)
    return min(sum(durations[i * size:(i + 1) * size]) for i in range(1, runs + 1))


def load_trace(path: str) -> List[dict]:
    """The events of an onnxruntime profile (a JSON list)."""
    with open(path) as f:
        return json.load(f)


def exported_name(name: str) -> str:
    """The exported node's name of a node of onnxruntime's trace: without the suffixes
    onnxruntime gives the nodes it rewrites."""
    for suffix in _RENAMED:
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def node_part(name: str, before: Tuple[str, str] = ('-', 'other')) -> Tuple[str, str]:
    """(stage, kind) of a node from its exporter scope name: the stage is the number of
    the first ``layers.<i>`` / ``stages.<i>`` ('-': none); the kind ``attention`` for an
    ``/attn/`` scope, ``mlp`` for ``/mlp`` / ``/ffn`` (the blocked MLPs' Scan bodies keep
    the MLP's node names) and the blocked MLPs' own ``/blocked_mlp<i>/`` nodes, ``norm``
    for a name with ``norm``, else ``other``. ``before``: the part of the node run just
    before it, taken by a node onnxruntime made without a scope name (a fused ``Gelu``, a
    layout reorder: its name does not start with ``/``), and its stage by a blocked MLP's
    own node."""
    name = exported_name(name)
    if not name.startswith('/'):
        return before
    stage = _STAGE.search(name)
    if '/attn/' in name:
        kind = 'attention'
    elif _BLOCKED.match(name):
        return before[0], 'mlp'
    elif '/mlp' in name or '/ffn' in name:
        kind = 'mlp'
    elif 'norm' in name:
        kind = 'norm'
    else:
        kind = 'other'
    return (stage.group(1) if stage else '-'), kind


def is_product(op: str) -> bool:
    """Whether a node of op type ``op`` is a product (:data:`PRODUCT_OPS`)."""
    return op in PRODUCT_OPS


def node_times(events: Sequence[dict], runs: int) -> List[NodeTime]:
    """Every node's time (:func:`group_fastest` of its kernel events) in a trace of one
    warm-up and ``runs`` runs, in the order of their first events, with its part
    (:func:`node_part`, the node before it being the one whose event came before, within
    the same run). A name onnxruntime gives several nodes (the fused nodes of every ``Scan``
    body it optimises) counts as one node per part. ``Scan`` nodes are left out (their
    bodies' nodes are in the trace)."""
    durations: Dict[Tuple[str, Tuple[str, str]], List[float]] = defaultdict(list)
    ops: Dict[Tuple[str, Tuple[str, str]], str] = {}
    before = ('-', 'other')
    for e in events:
        if e.get('cat') == 'Session' and e.get('name') == 'model_run':
            before = ('-', 'other')  # the end of a run: the next run starts afresh
        if e.get('cat') != 'Node' or not e.get('name', '').endswith(_KERNEL):
            continue
        name = e['name'][:-len(_KERNEL)]
        key = (name, node_part(name, before))
        durations[key].append(float(e['dur']))
        ops[key] = e.get('args', {}).get('op_name', '')
        if ops[key] != 'Scan':
            before = key[1]
    return [
        NodeTime(name, ops[(name, part)],
                 group_fastest(durs, runs) / 1e3, *part)
        for (name, part), durs in durations.items() if ops[(name, part)] != 'Scan'
    ]


def summarize(nodes: Sequence[NodeTime], top: int = 12) -> dict:
    """The sums of a profile's nodes (ms): ``total``; ``ops``, the ``top`` op types by time,
    each ``[op, ms, count]`` (count: the nodes of :func:`node_times`); ``parts``, ms by
    stage and kind (``{stage: {kind: ms}}``); ``attention_products`` and
    ``attention_elementwise`` (its other nodes)."""
    by_op: Dict[str, List[float]] = defaultdict(lambda: [0.0, 0])
    parts: Dict[str, Dict[str, float]] = defaultdict(lambda: dict.fromkeys(KINDS, 0.0))
    products = elementwise = 0.0
    for n in nodes:
        by_op[n.op][0] += n.ms
        by_op[n.op][1] += 1
        parts[n.stage][n.kind] += n.ms
        if n.kind == 'attention':
            if is_product(n.op):
                products += n.ms
            else:
                elementwise += n.ms
    ops = sorted(([op, ms, count] for op, (ms, count) in by_op.items()), key=lambda r: -r[1])
    return dict(
        total=sum(n.ms for n in nodes),
        ops=ops[:top],
        parts={s: parts[s]
               for s in sorted(parts, key=lambda s: (s == '-', s.zfill(4)))},
        attention_products=products,
        attention_elementwise=elementwise)


def profile_session(path: str, input_shape: Sequence[int], runs: int, threads: Optional[int],
                    folder: str) -> Tuple[float, List[NodeTime]]:
    """Run the graph at ``path`` on a float32 random input of ``input_shape`` (the
    backbones': (1, 3, H, W)) in a CPU session with profiling on (``threads`` intra-op
    threads, the trace written to ``folder``): one warm-up run, then ``runs`` timed ones.
    Returns the median wall time of the timed runs (ms) and :func:`node_times` of the
    trace."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = osp.join(folder, osp.splitext(osp.basename(path))[0] + '_profile')
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])
    image = np.random.default_rng(0).standard_normal(tuple(input_shape), dtype=np.float32)
    feed = {session.get_inputs()[0].name: image}
    session.run(None, feed)
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        walls.append((time.perf_counter() - start) * 1e3)
    trace = session.end_profiling()
    return float(np.median(walls)), node_times(load_trace(trace), runs)


def profile_run(config: str,
                part: str,
                shape: Sequence[int],
                folder: str,
                runs: int = 6,
                opsets: Sequence[int] = OPSETS,
                threads: Optional[int] = None) -> Profile:
    """Export ``part`` (``'backbone'`` or ``'tensor'``) of ``config`` to ``folder`` as
    :func:`~.benchmark.prepare_run` exports it and profile it there
    (:func:`profile_session`). A failure gives a profile whose ``error`` says why."""
    if part not in ('backbone', 'tensor'):
        raise ValueError(f"part must be 'backbone' or 'tensor', got {part!r}")
    H, W = (int(s) for s in shape)
    row = prepare_run(config, part, (H, W), folder, opsets, threads).row
    profile = Profile(row.config, part, row.what, H, W, row.opset, error=row.error)
    if row.error is not None:
        return profile
    path = osp.join(folder, onnx_file_name(config, part, (H, W), row.opset))
    try:
        wall, nodes = profile_session(path, (1, 3, H, W), runs, threads, folder)
    except Exception as err:  # noqa: B902 -- every failure becomes the profile's reason
        return profile._replace(error=f'{type(err).__name__}: {err}'.splitlines()[0])
    return profile._replace(wall_ms=wall, nodes=tuple(nodes))


def _header(p: Profile, summary: dict) -> str:
    """The line naming a profile and its times."""
    return (f'**{p.config}** ({p.what or p.part}, opset {p.opset}, {p.height}x{p.width}): '
            f'median wall time {p.wall_ms:.1f} ms, summed node time {summary["total"]:.1f} ms')


def _tables(summary: dict) -> List[str]:
    """The op-type table, the stage x kind table and the attention split of a summary."""
    total = summary['total'] or 1.0
    lines = ['| op type | ms | share | nodes |', '|---|---|---|---|']
    lines += [
        f'| {op} | {ms:.2f} | {ms / total:.1%} | {count} |' for op, ms, count in summary['ops']
    ]
    lines += ['', '| stage | ' + ' | '.join(KINDS) + ' | all |', '|---' * (len(KINDS) + 2) + '|']
    for stage, kinds in summary['parts'].items():
        cells = ' | '.join(f'{kinds[k]:.2f}' for k in KINDS)
        lines.append(f'| {stage} | {cells} | {sum(kinds.values()):.2f} |')
    lines += [
        '', f'attention: products {summary["attention_products"]:.2f} ms, elementwise and '
        f'layout {summary["attention_elementwise"]:.2f} ms'
    ]
    return lines


def format_markdown(profiles: Sequence[Profile], top: int = 12) -> str:
    """The report of the profiles (ms), one section per profile: its header, the ``top``
    op types, the stage x kind table and the attention's products against its elementwise
    and layout nodes; a failed profile says why; then :func:`compare_pairs`."""
    sections = []
    for p in profiles:
        if p.error is not None:
            sections.append(f'**{p.config}** ({p.part}, {p.height}x{p.width}): failed: {p.error}')
            continue
        summary = summarize(p.nodes, top)
        sections.append('\n'.join([_header(p, summary), ''] + _tables(summary)))
    pairs = compare_pairs(profiles)
    if pairs:
        sections.append('\n'.join(f'- {line}' for line in pairs))
    return '\n\n'.join(sections)


def compare_pairs(profiles: Sequence[Profile]) -> List[str]:
    """One line per consecutive pair of profiles (an even number of them): the summed
    times, their ratio, and the ratio with the first's attention elementwise and layout
    nodes free (a lower bound for any graph of the same products). Empty for an odd
    number; a pair with a failed profile says so."""
    if len(profiles) % 2:
        return []
    lines = []
    for a, b in zip(profiles[::2], profiles[1::2]):
        if a.error is not None or b.error is not None or not b.nodes:
            lines.append(f'{a.config} / {b.config}: not compared (a profile failed or is empty)')
            continue
        sa, sb = summarize(a.nodes), summarize(b.nodes)
        free = sa['total'] - sa['attention_elementwise']
        lines.append(f'{a.config} / {b.config}: {sa["total"]:.1f} / {sb["total"]:.1f} ms = '
                     f'{sa["total"] / sb["total"]:.2f}x; the first with its attention\'s '
                     f'elementwise and layout nodes free: {free:.1f} ms = '
                     f'{free / sb["total"]:.2f}x')
    return lines


def write_json(path: str, profiles: Sequence[Profile], env: dict, top: int = 12) -> None:
    """The profiles as JSON: ``env`` (versions, threads, load, command) and, per profile,
    its fields without the nodes, its :func:`summarize` and its nodes (name, op, ms,
    stage, kind); ``pairs``: :func:`compare_pairs`."""
    rows = []
    for p in profiles:
        row = {k: v for k, v in p._asdict().items() if k != 'nodes'}
        if p.error is None:
            row.update(summary=summarize(p.nodes, top), nodes=[n._asdict() for n in p.nodes])
        rows.append(row)
    with open(path, 'w') as f:
        json.dump(dict(env=env, profiles=rows, pairs=compare_pairs(profiles)), f, indent=2)
        f.write('\n')
