"""The Pola vs softmax table of finished runs, paper style: Markdown, CSV and a bar chart
(``tools/analysis_tools/gain_table.py``; ``tools/reproduce.py`` makes one per task).

:func:`collect_runs` reads the ``test_metrics.json`` records that ``tools/test.py`` writes
(each names the config and checkpoint it tested and whether it used test-time
augmentation); :func:`build_rows` groups the runs by model, dataset and schedule, pairs
each Pola run with its softmax baseline (the same config name without ``pola-``) and adds
a delta row; params and FLOPs are the backbone's at the task's standard input size
(:class:`FlopsCounter`, :mod:`polaformer_mm.analysis.flops`). :func:`make_gain_table` does
it all and writes the files.
"""
import csv
import glob
import json
import math
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence

from mmengine.config import Config

from polaformer_mm.analysis.flops import (backbone_key, default_shape, describe_backbone, measure,
                                          register_extra_flop_ops, scope_registry)
from polaformer_mm.engine.entry import TEST_METRICS_FILE
from polaformer_mm.models.family import families
from polaformer_mm.utils.checkpoint_io import atomic_write
from polaformer_mm.utils.output_paths import check_output_files

#: the file of a test's results that tools/test.py writes into its --work-dir
METRICS_FILE = TEST_METRICS_FILE

# column name -> (label, source: 'single' or 'tta', key in the metrics, scale)
DET_COLUMNS = {
    'AP_b': ('AP^b', 'single', 'coco/bbox_mAP', 100.),
    'AP_b_50': ('AP^b_50', 'single', 'coco/bbox_mAP_50', 100.),
    'AP_b_75': ('AP^b_75', 'single', 'coco/bbox_mAP_75', 100.),
    'AP_m': ('AP^m', 'single', 'coco/segm_mAP', 100.),
}
SEG_COLUMNS = {
    'mIoU': ('mIoU', 'single', 'mIoU', 1.),
    'mIoU_ms_flip': ('mIoU(ms+flip)', 'tta', 'mIoU', 1.),
}
PANOPTIC_COLUMNS = {'PQ': ('PQ', 'single', 'coco_panoptic/PQ', 1.)}
CSV_FIELDS = (
    ['group', 'backbone', 'row', 'config', 'params_M', 'flops_G', 'flops_input', 'schedule']
    + list(DET_COLUMNS) + list(SEG_COLUMNS) + list(PANOPTIC_COLUMNS))
MODEL_NAMES = {
    'MaskRCNN': 'Mask R-CNN',
    'RetinaNet': 'RetinaNet',
    'FPNHead': 'Semantic FPN',
    'UPerHead': 'UperNet',
    'CascadeRCNN': 'Cascade Mask R-CNN',
    'Mask2Former': 'Mask2Former',
    'Mask2FormerHead': 'Mask2Former',
}
DATASET_NAMES = {
    'CocoDataset': 'COCO',
    'ADE20KDataset': 'ADE20K',
    'CocoPanopticDataset': 'COCO panoptic',
    'CityscapesDataset': 'Cityscapes',
}
# the order of sizes in the table (sizes of other names after these, alphabetically)
_SIZES = ['t', 's', 'm', 'l', 'b'] + [f'b{i}' for i in range(6)]


def _arch_of(stem: str):
    """(index of the family among the registered ones, family, 'pola-' or None, size) of
    the '[pola-]<family>-<size>' word of a config name (``BackboneFamily.config_pattern``),
    or None."""
    for index, family in enumerate(families()):
        m = family.config_pattern().search(stem)
        if m:
            return index, family, m['pola'], m['size']
    return None


class Run:
    """One config's evaluations: the single-scale and the ``--tta`` test records."""

    def __init__(self, stem: str):
        self.stem = stem
        self.records: Dict[str, dict] = {}  # 'single' / 'tta' -> test_metrics.json record
        self.files: Dict[str, str] = {}
        self.cfg: Optional[Config] = None

    def add(self, path: str, record: dict) -> None:
        """Take a test record (the newest of its kind counts)."""
        kind = 'tta' if record.get('tta') else 'single'
        if kind not in self.records or record.get('time', '') >= self.records[kind].get('time', ''):
            self.records[kind] = record
            self.files[kind] = path

    def metric(self, source: str, key: str, scale: float) -> Optional[float]:
        """A metric of the 'single' or 'tta' test, times ``scale``; None if missing."""
        value = self.records.get(source, {}).get('metrics', {}).get(key)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(value) * scale


def _read_record(path: str) -> dict:
    with open(path) as f:
        try:
            record = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f'{path}: not a JSON file ({e})') from None
    for key in ('config', 'metrics'):
        if key not in record:
            raise ValueError(f'{path}: no {key!r} entry (expected what tools/test.py writes)')
    return record


def _metric_files(work_dir: str) -> List[str]:
    """The records in ``work_dir`` and up to two folder levels below it."""
    return sorted(
        glob.glob(osp.join(work_dir, METRICS_FILE))
        + glob.glob(osp.join(work_dir, '*', METRICS_FILE))
        + glob.glob(osp.join(work_dir, '*', '*', METRICS_FILE)))


def collect_runs(work_dirs: List[str]) -> List[Run]:
    """Find the test records under ``work_dirs`` (run dirs or folders of run dirs)."""
    runs: Dict[str, Run] = {}
    seen = set()
    for work_dir in work_dirs:
        if not osp.isdir(work_dir):
            raise FileNotFoundError(f'work dir not found: {work_dir}')
        files = _metric_files(work_dir)
        if not files:
            raise FileNotFoundError(
                f'{work_dir}: no {METRICS_FILE} in it or up to two folders down '
                '(tools/test.py writes one into its --work-dir)')
        for path in files:
            if osp.realpath(path) in seen:
                continue
            seen.add(osp.realpath(path))
            record = _read_record(path)
            stem = osp.splitext(osp.basename(record['config']))[0]
            runs.setdefault(stem, Run(stem)).add(path, record)
    for run in runs.values():
        run.cfg = _load_config(run)
    return list(runs.values())


def _load_config(run: Run) -> Config:
    """The config the run was tested with: the copy mmengine dumped into the single-scale
    test's work dir, else the recorded config file with the recorded --cfg-options."""
    kind = 'single' if 'single' in run.records else 'tta'
    record = run.records[kind]
    dumped = osp.join(osp.dirname(run.files[kind]), osp.basename(record['config']))
    if osp.isfile(dumped):
        cfg = Config.fromfile(dumped)
    elif osp.isfile(record['config']):
        cfg = Config.fromfile(record['config'])
        if record.get('cfg_options'):
            cfg.merge_from_dict(record['cfg_options'])
    else:
        raise FileNotFoundError(f"{run.files[kind]}: its config {record['config']} is gone "
                                f'and no copy was dumped beside it')
    if 'module' in cfg.model:  # a TTA wrapper
        cfg.model = cfg.model.module
    return cfg


def _innermost(dataset):
    while 'dataset' in dataset:
        dataset = dataset['dataset']
    return dataset


def schedule_of(cfg: Config) -> str:
    """'1x (12 ep)', '3x (36 ep)', '80k it', ... from ``train_cfg``."""
    train_cfg = cfg.get('train_cfg') or {}
    if 'max_iters' in train_cfg:
        n = int(train_cfg['max_iters'])
        return f'{n // 1000}k it' if n >= 1000 and n % 1000 == 0 else f'{n} it'
    if 'max_epochs' in train_cfg:
        n = int(train_cfg['max_epochs'])
        return f'{n // 12}x ({n} ep)' if n % 12 == 0 else f'{n} ep'
    return '-'


def group_of(cfg: Config) -> str:
    """'Mask R-CNN, COCO, 1x (12 ep)': model, dataset and schedule of a config."""
    model = cfg.model
    kind = model.get('type', '?')
    if 'decode_head' in model:
        kind = model.decode_head.get('type', kind)
    name = MODEL_NAMES.get(kind, kind)
    neck = model.get('neck')
    if isinstance(neck, dict) and str(neck.get('type', '')).split('.')[-1] == 'MultiLevelNeck':
        name += ' + MLN'  # mmseg's multi-level neck (the UperNet of a plain transformer)
    dataset = str(_innermost(cfg.test_dataloader.dataset).get('type', '?')).split('.')[-1]
    return f'{name}, {DATASET_NAMES.get(dataset, dataset)}, {schedule_of(cfg)}'


def backbone_label(run: Run) -> str:
    """'Pola-PVT-T', 'Swin-S', ... (``BackboneFamily.config_title`` and the size) from the
    config name, else from the config."""
    arch = _arch_of(run.stem)
    if arch:
        _, family, pola, size = arch
        title = family.config_title or family.title
        return f"{'Pola-' if pola else ''}{title}-{size.upper()}"
    return describe_backbone(run.cfg)


def is_pola(run: Run) -> bool:
    """Whether the run's backbone computes Pola attention: a Pola backbone (its type
    ``Pola*``) with at least one 'L' in its ``attn_types`` when the config sets them (an
    all-'S' Pola backbone is a softmax baseline of its family)."""
    backbone = run.cfg.model.backbone
    if not str(backbone.get('type', '')).split('.')[-1].startswith('Pola'):
        return False
    attn_types = backbone.get('attn_types')
    return attn_types is None or 'L' in str(attn_types)


def _sort_key(run: Run):
    arch = _arch_of(run.stem)
    if not arch:
        return (len(families()), len(_SIZES), run.stem)
    index, _, _, size = arch
    return (index, _SIZES.index(size) if size in _SIZES else len(_SIZES), run.stem)


class FlopsCounter:
    """Params and FLOPs of a run's backbone at its task's standard size, measured once per
    backbone setting (and remembered in ``cache_file`` across calls, if given)."""

    def __init__(self, enabled: bool = True, cache_file: Optional[str] = None):
        self.enabled = enabled
        self.cache_file = cache_file
        self.cache = {}
        if cache_file and osp.isfile(cache_file):
            with open(cache_file) as f:
                self.cache = json.load(f)
        register_extra_flop_ops()

    def __call__(self, cfg: Config) -> dict:
        scope = cfg.get('default_scope')
        shape = default_shape(cfg)
        key = json.dumps([scope, backbone_key(cfg, False), list(shape), self.enabled])
        if key not in self.cache:
            if self.enabled:
                result = measure(cfg, tuple(shape), whole=False)
            else:
                result = dict(params=_count_params(cfg), flops=None)
            self.cache[key] = dict(params=result['params'], flops=result['flops'])
            self._save()
        result = dict(self.cache[key])
        result['shape'] = f'{shape[0]}x{shape[1]}'
        return result

    def _save(self):
        if self.cache_file:
            os.makedirs(osp.dirname(osp.abspath(self.cache_file)), exist_ok=True)
            atomic_write(self.cache_file, self._write)  # whole or untouched, when killed

    def _write(self, path: str) -> None:
        with open(path, 'w') as f:
            json.dump(self.cache, f, indent=1)


def _count_params(cfg: Config) -> int:
    from mmengine.registry import DefaultScope
    scope = cfg.default_scope
    with DefaultScope.overwrite_default_scope(scope):
        backbone = scope_registry(scope).build(cfg.model.backbone)
    return sum(p.numel() for p in backbone.parameters())


def build_rows(runs: List[Run], flops: FlopsCounter) -> List[dict]:
    """One row per run and one delta row per Pola / softmax pair, grouped."""
    groups: Dict[str, List[Run]] = {}
    for run in sorted(runs, key=_sort_key):
        groups.setdefault(group_of(run.cfg), []).append(run)
    by_stem = {run.stem: run for run in runs}
    rows = []
    for group, members in groups.items():
        columns = _columns(members)
        done = set()
        for run in members:
            if run.stem in done:
                continue
            pair = [run]
            if is_pola(run):
                base = by_stem.get(run.stem.replace('pola-', '', 1))
                if base is not None and base is not run and base.stem not in done:
                    pair = [base, run]
            else:
                pola = next((r for r in members if r.stem not in done and is_pola(r)
                             and r.stem.replace('pola-', '', 1) == run.stem), None)
                if pola is not None:
                    pair = [run, pola]
            pair_rows = [_run_row(group, r, columns, flops) for r in pair]
            done.update(r.stem for r in pair)
            rows.extend(pair_rows)
            if len(pair_rows) == 2:
                rows.append(_delta_row(group, *pair_rows, columns))
    return rows


def _columns(members: List[Run]) -> Dict[str, tuple]:
    if members[0].cfg.default_scope == 'mmdet':
        columns = dict(DET_COLUMNS)
        if not any(r.metric('single', 'coco/segm_mAP', 1.) is not None for r in members):
            columns.pop('AP_m')
        if any(r.metric('single', 'coco_panoptic/PQ', 1.) is not None for r in members):
            columns.update(PANOPTIC_COLUMNS)
        return columns
    return dict(SEG_COLUMNS)


def _run_row(group, run, columns, flops):
    size = flops(run.cfg)
    row = dict(
        group=group,
        backbone=backbone_label(run),
        row='pola' if is_pola(run) else 'softmax',
        config=run.stem,
        params_M=size['params'] / 1e6,
        flops_G=None if size['flops'] is None else size['flops'] / 1e9,
        flops_input=size['shape'],
        schedule=schedule_of(run.cfg),
        columns=columns)
    for name, (_, source, key, scale) in columns.items():
        row[name] = run.metric(source, key, scale)
    return row


def _delta_row(group, base, pola, columns):
    row = dict(
        group=group,
        backbone=f"{pola['backbone']} - {base['backbone']}",
        row='delta',
        config='',
        flops_input=pola['flops_input'],
        schedule='',
        columns=columns)
    for name in ['params_M', 'flops_G'] + list(columns):
        a, b = pola.get(name), base.get(name)
        row[name] = None if a is None or b is None else a - b
    return row


def _fmt(value, digits, signed=False):
    if value is None:
        return '-'
    return f'{value:+.{digits}f}' if signed else f'{value:.{digits}f}'


def format_markdown(rows: List[dict]) -> str:
    """The rows as Markdown, one table per group."""
    out = []
    for group in dict.fromkeys(r['group'] for r in rows):
        members = [r for r in rows if r['group'] == group]
        columns = members[0]['columns']
        shape = members[0]['flops_input']
        out.append(f'### {group}\n')
        out.append('| Backbone | Params (M) | FLOPs (G) | Schedule | '
                   + ' | '.join(c[0] for c in columns.values()) + ' |')
        out.append('|---|---:|---:|---|' + '---:|' * len(columns))
        for r in members:
            delta = r['row'] == 'delta'
            name = f"*delta {r['backbone']}*" if delta else r['backbone']
            cells = [
                name,
                _fmt(r['params_M'], 2, delta),
                _fmt(r['flops_G'], 2, delta), r['schedule']
            ]
            cells += [_fmt(r[c], 1 if columns[c][3] == 100. else 2, delta) for c in columns]
            out.append('| ' + ' | '.join(cells) + ' |')
        out.append(f'\nParams and FLOPs: the backbone at {shape}. Delta rows: Pola minus '
                   'softmax.\n')
    return '\n'.join(out)


def write_csv(rows: List[dict], path: str) -> None:
    """The rows as CSV (4 decimals)."""
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction='ignore')
        writer.writeheader()
        for r in rows:
            writer.writerow({
                k: ('' if r.get(k) is None else
                    round(r[k], 4) if isinstance(r.get(k), float) else r[k])
                for k in CSV_FIELDS
            })


def plot_deltas(rows: List[dict], path: str) -> List[tuple]:
    """Bar chart of the delta rows, one panel per group.

    Returns:
        The bars drawn, as (group, backbone, column, value); empty (and no file) when
        there is no Pola / softmax pair.
    """
    deltas = [r for r in rows if r['row'] == 'delta']
    if not deltas:
        return []
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    groups = list(dict.fromkeys(r['group'] for r in deltas))
    fig, axes = plt.subplots(
        1, len(groups), figsize=(max(4.5, 3.2 * len(groups) + 2), 3.6), squeeze=False)
    drawn = []
    for ax, group in zip(axes[0], groups):
        members = [r for r in deltas if r['group'] == group]
        columns = members[0]['columns']
        width = 0.8 / len(columns)
        for i, (name, (label, *_)) in enumerate(columns.items()):
            xs = [j + (i - (len(columns) - 1) / 2) * width for j in range(len(members))]
            values = [r[name] if r[name] is not None else 0. for r in members]
            bars = ax.bar(xs, values, width, label=label)
            drawn += [(group, r['backbone'], name, r[name]) for r in members]
            ax.bar_label(
                bars,
                labels=[_fmt(r[name], 1 if columns[name][3] == 100. else 2, True) for r in members],
                fontsize=7)
        ax.axhline(0, color='black', linewidth=0.8)
        ax.set_xticks(range(len(members)))
        ax.set_xticklabels([r['backbone'].split(' - ')[0] for r in members])
        ax.set_title(group, fontsize=9)
        ax.set_ylabel('Pola - softmax')
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn


def check_outputs(out: Optional[str], flops_cache: Optional[str]) -> None:
    """Before any measurement: the files of ``out`` (``out.md``, ``out.csv``, ``out.png``;
    the folder is made) and the ``flops_cache`` file can be written where they are named
    (a file is created and removed there) and are not one file; an
    :class:`~polaformer_mm.utils.output_paths.OutputPathError` naming the option and path
    otherwise."""
    outputs = {f'--out ({ext})': out + ext for ext in ('.md', '.csv', '.png')} if out else {}
    outputs['--flops-cache'] = flops_cache
    check_output_files(outputs, makes_folder=True)


def make_gain_table(work_dirs: Sequence[str],
                    out: Optional[str] = None,
                    flops: bool = True,
                    flops_cache: Optional[str] = None) -> List[dict]:
    """The table of the runs under ``work_dirs`` (run work dirs, or folders of them),
    printed as Markdown; with ``out``, written to ``out.md``, ``out.csv`` and (when there is
    a Pola / softmax pair) the chart ``out.png``. ``flops=False`` counts the params only;
    ``flops_cache`` remembers measured backbones between calls (both checked first:
    :func:`check_outputs`). Returns the rows."""
    check_outputs(out, flops_cache)
    runs = collect_runs(list(work_dirs))
    rows = build_rows(runs, FlopsCounter(flops, flops_cache))
    text = format_markdown(rows)
    print(text)
    if out:
        os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
        with open(out + '.md', 'w') as f:
            f.write(text + '\n')
        write_csv(rows, out + '.csv')
        written = [out + '.md', out + '.csv']
        if plot_deltas(rows, out + '.png'):
            written.append(out + '.png')
        else:
            print('no Pola / softmax pair with results yet: no chart')
        print('wrote ' + ', '.join(written))
    return rows
