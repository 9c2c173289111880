"""The table and the figure of a backbone benchmark
(:func:`polaformer_mm.analysis.benchmark.benchmark_data`).

* :func:`format_report`: the command, the environment, one row per measurement (time in
  ms, memory delta and peak in MiB) and the Pola / baseline ratios, as Markdown.
* :func:`fit_summary`: where each backbone stops fitting (the largest input that ran and
  the smallest that ran out of memory), when a measurement did.
* :func:`draw`: time and memory delta against pixels per image (log-log), one line per
  backbone (and batch size), Pola solid and its baseline dashed in the same colour; one
  column per (mode, precision).
"""
from typing import Tuple

from .benchmark import baseline_of

__all__ = ['memory_names', 'format_report', 'fit_summary', 'draw']


def rounds_note(settings: dict) -> str:
    """How the rounds of a run entered its medians ('' for one round)."""
    rounds = settings.get('rounds', 1)
    if rounds == 1:
        return ''
    return f' in each of {rounds} rounds (median of all; the backbones take turns per round)'


def _fmt_mib(v) -> str:
    return '-' if v is None else f'{v:.0f}'


def _fmt_ms(seconds) -> str:
    ms = seconds * 1e3
    return f'{ms:.1f}' if ms >= 100 else f'{ms:.2f}'


def _fmt_ratio(v) -> str:
    return '-' if v is None else f'{v:.2f}'


def memory_names(device_type: str) -> Tuple[str, str]:
    """(delta column, peak column) headers for the device's memory measure."""
    if device_type == 'cuda':
        return 'alloc delta (MiB)', 'max alloc (MiB)'
    return 'RSS delta (MiB)', 'max RSS (MiB)'


def format_report(data: dict) -> str:
    """The report of a run (:func:`~polaformer_mm.analysis.benchmark.benchmark_data`) as
    Markdown: command, environment, the table, the ratios and what failed."""
    settings = data['settings']
    delta_name, peak_name = memory_names(settings['device_type'])
    env = data['env']
    lines = [
        f"command: {data['command']}",
        f"device: {env['device_name']}; torch {env['torch']}; threads {env['threads']}; "
        f"{settings['warmup']} warm-up + median of {settings['repeat']} steps"
        f"{rounds_note(settings)}; "
        f"isolation: {settings['isolate']}",
        f"memory: {data['memory_note']}",
        '',
        f'| backbone | mode | precision | input (HxW) | batch | params (M) | time (ms) | '
        f'{delta_name} | {peak_name} |',
        '|---|---|---|---|---:|---:|---:|---:|---:|',
    ]
    for r in data['results']:
        size = f"{r['height']}x{r['width']}"
        params = f"{r['params_m']:.2f}" if r.get('params_m') is not None else '-'
        if r['status'] == 'ok':
            cells = [
                _fmt_ms(r['time_s']),
                _fmt_mib(r['mem_delta_mib']),
                _fmt_mib(r['mem_peak_mib'])
            ]
        else:
            cells = [r['status'].upper(), '-', '-']
        lines.append(f"| {r['backbone']} | {r['mode']} | {r['precision']} | {size} | "
                     f"{r['batch']} | {params} | " + ' | '.join(cells) + ' |')
    if data['ratios']:
        lines += [
            '', f'Pola / baseline (below 1: Pola is faster / leaner); memory ratios '
            f'of the {delta_name.split(" (")[0]} and the {peak_name.split(" (")[0]}:', '',
            '| Pola | baseline | mode | precision | input (HxW) | batch | time | '
            'mem delta | mem peak |', '|---|---|---|---|---|---:|---:|---:|---:|'
        ]
        for q in data['ratios']:
            lines.append(f"| {q['pola']} | {q['baseline']} | {q['mode']} | {q['precision']} "
                         f"| {q['height']}x{q['width']} | {q['batch']} | "
                         f"{_fmt_ratio(q['time'])} | {_fmt_ratio(q['mem_delta'])} | "
                         f"{_fmt_ratio(q['mem_peak'])} |")
    lines += _fit_lines(data)
    failed = [r for r in data['results'] if r['status'] != 'ok']
    for r in failed:
        lines.append(f"\n{r['status'].upper()}: {r['backbone']} {r['mode']} "
                     f"{r['precision']} {r['height']}x{r['width']} b{r['batch']}: "
                     f"{r.get('error', '')}")
    if data['overrides']:
        lines += ['', 'overrides: ' + '; '.join(data['overrides'])]
    return '\n'.join(lines)


def fit_summary(data: dict) -> list:
    """Per (backbone, mode, precision, batch) with an out-of-memory measurement: the
    largest input (in pixels) that ran and the smallest that did not fit."""
    groups = {}
    for r in data['results']:
        key = (r['backbone'], r['mode'], r['precision'], r['batch'])
        groups.setdefault(key, []).append(r)
    rows = []
    for (backbone, mode, precision, batch), rs in groups.items():
        oom = [r for r in rs if r['status'] == 'oom']
        if not oom:
            continue
        first_oom = min(oom, key=lambda r: r['pixels'])
        ran = [r for r in rs if r['status'] == 'ok' and r['pixels'] < first_oom['pixels']]
        largest = max(ran, key=lambda r: r['pixels']) if ran else None
        rows.append(
            dict(
                backbone=backbone,
                mode=mode,
                precision=precision,
                batch=batch,
                largest_ok=None if largest is None else (largest['height'], largest['width']),
                smallest_oom=(first_oom['height'], first_oom['width'])))
    return rows


def _fit_lines(data: dict) -> list:
    rows = fit_summary(data)
    if not rows:
        return []
    limit = data['settings'].get('memory_limit_gib')
    where = f'a limit of {limit:g} GiB resident' if limit else 'the device'
    lines = [
        '', f'Where a backbone stops fitting ({where}):', '',
        '| backbone | mode | precision | batch | largest input that ran | '
        'smallest input that did not fit |', '|---|---|---|---:|---|---|'
    ]
    for q in rows:
        ok = '-' if q['largest_ok'] is None else '{}x{}'.format(*q['largest_ok'])
        lines.append(f"| {q['backbone']} | {q['mode']} | {q['precision']} | {q['batch']} | "
                     f"{ok} | {q['smallest_oom'][0]}x{q['smallest_oom'][1]} |")
    return lines


def draw(data: dict, path: str) -> None:
    """Time and memory delta against pixels per image (log-log), one line per backbone
    (and batch size); one column per (mode, precision)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    results = [r for r in data['results'] if r['status'] == 'ok']
    columns = list(dict.fromkeys((r['mode'], r['precision']) for r in data['results']))
    labels = list(dict.fromkeys(r['backbone'] for r in data['results']))
    batches = sorted({r['batch'] for r in data['results']})
    delta_name, _ = memory_names(data['settings']['device_type'])
    # one colour per Pola / baseline pair: Pola solid, the baseline dashed
    colours, styles = {}, {}
    cycle = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for label in labels:
        base = baseline_of(label, labels)
        if label in colours:
            continue
        colours[label] = cycle[len(set(colours.values())) % len(cycle)]
        styles[label] = '-'
        if base is not None:
            colours[base], styles[base] = colours[label], '--'
    fig, axes = plt.subplots(2, len(columns), figsize=(5.5 * len(columns), 8), squeeze=False)
    for col, (mode, precision) in enumerate(columns):
        panels = (('time_s', 1e3, 'time (ms)'), ('mem_delta_mib', 1, delta_name))
        for row, (key, scale, name) in enumerate(panels):
            ax = axes[row][col]
            for label in labels:
                for b in batches:
                    pts = sorted(
                        (r['pixels'], r[key] * scale) for r in results
                        if r['backbone'] == label and r['batch'] == b and r['mode'] == mode
                        and r['precision'] == precision and r[key] is not None and r[key] > 0)
                    if not pts:
                        continue
                    tag = label if len(batches) == 1 else f'{label} b{b}'
                    ax.plot([p[0] for p in pts], [p[1] for p in pts],
                            marker='o',
                            color=colours[label],
                            linestyle=styles[label],
                            label=tag)
            ax.set_xscale('log')
            ax.set_yscale('log')
            ax.set_xlabel('pixels per image (H x W)')
            ax.set_ylabel(name)
            ax.set_title(f'{mode}, {"float32" if precision == "none" else precision}')
            ax.grid(True, which='both', alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
    fig.suptitle(f"{data['env']['device_name']}, batch {', '.join(map(str, batches))}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
