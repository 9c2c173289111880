"""The quickstart: a detector and a segmenter trained from scratch on the built-in
synthetic data, evaluated and drawn (``tools/quickstart.py``, ``make quickstart``).

:func:`run_quickstart` generates the data if it is missing, trains and evaluates each task
(and, with ``compare``, its softmax counterpart) in child processes of their own, several
side by side on a CPU, and prints and writes the summary. A child runs this module:
``python -m polaformer_mm.workflows.quickstart JOB_FILE`` (:func:`train_job`).
"""
import json
import os
import os.path as osp
import pickle
import subprocess
import sys
import time
from typing import Dict, Iterable, Optional

from polaformer_mm.datasets import SYNTHETIC_DEFAULTS, generate_synthetic_dataset
from polaformer_mm.engine import entry
from polaformer_mm.workflows import project_root

#: the folder of ``configs/`` (the repository, or an installed package's ``.mim``)
REPO = project_root()
TASKS = {
    'det':
    dict(
        config='configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py',
        name='Mask R-CNN',
        metrics=(('coco/bbox_mAP', 'bbox mAP'), ('coco/bbox_mAP_50', 'bbox mAP@50'),
                 ('coco/bbox_mAP_75', 'bbox mAP@75'), ('coco/segm_mAP', 'segm mAP'),
                 ('coco/segm_mAP_50', 'segm mAP@50'))),
    'seg':
    dict(
        config='configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py',
        name='Semantic FPN',
        metrics=(('mIoU', 'mIoU'), ('IoU.background', 'IoU background'), ('IoU.circle',
                                                                          'IoU circle'),
                 ('IoU.square', 'IoU square'), ('IoU.triangle', 'IoU triangle'), ('aAcc', 'aAcc'))),
}
# the softmax counterpart: PVT spatial-reduction softmax attention in every stage
VARIANTS = {'pola': {}, 'softmax': {'model.backbone.attn_types': 'SSSS'}}
SCALE = 3  # drawings are upscaled by this factor
# What a working install reaches with the default settings (docs/get_started.md,
# "Quickstart", has the runs behind these figures): every Pola model at or above these
FLOORS = {
    'det': (('coco/bbox_mAP', 'bbox mAP', 0.30), ('coco/bbox_mAP_50', 'bbox mAP@50', 0.60)),
    'seg': (('mIoU', 'mIoU', 70.0), ('IoU.circle', 'IoU circle', 50.0),
            ('IoU.square', 'IoU square', 50.0), ('IoU.triangle', 'IoU triangle', 50.0)),
}
# ... and the range the runs in docs/get_started.md ("Quickstart") spanned
EXPECTED = ('expect on a 2-core CPU: about 5 min in total (4.3-6.0 min measured in four runs, '
            'seeds 0-2; the two trainings bound it, and a slower machine takes longer in '
            'proportion); '
            'bbox mAP 0.53-0.57, mAP@50 0.76-0.82; mIoU 73-77, each shape class 59-79')


# ----------------------------------------------------------------------------- configs
def _set_data_root(cfg, data_root):
    root = osp.abspath(data_root).rstrip('/') + '/'
    for split in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[split].dataset.data_root = root
    for ev in ('val_evaluator', 'test_evaluator'):
        if 'ann_file' in cfg[ev]:
            cfg[ev].ann_file = osp.join(root, osp.relpath(cfg[ev].ann_file, cfg.data_root))


def _config(job, phase):
    """The task's config with the job's overrides, pointed at the job's data."""
    path = osp.join(REPO, TASKS[job['task']]['config'])
    cfg = entry.load_config(path, job['options'])
    _set_data_root(cfg, job['data_root'])
    # visualizers are named singletons: one per runner of this process
    cfg.experiment_name = f'{job["task"]}_{job["variant"]}_{phase}_{time.strftime("%Y%m%d_%H%M%S")}'
    cfg.visualizer.name = cfg.experiment_name
    return cfg, path


# ----------------------------------------------------------------------------- training
def _rss_mib():
    """The current resident set size (MiB); None where /proc is missing."""
    if not osp.exists('/proc/self/statm'):
        return None
    with open('/proc/self/statm') as f:
        return round(int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20)


def _peak_rss_mib():
    """This process's high-water mark of resident memory so far (MiB)."""
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(peak / (2**20 if sys.platform == 'darwin' else 2**10))


def _fused_optimizer(cfg):
    """AdamW as one fused kernel per parameter tensor where the installed torch has one for
    the device (CUDA; the CPU from torch 2.4): the same update, a fraction of the
    per-tensor operations of ``foreach=True``, which the configs keep for older torch."""
    import torch

    from polaformer_mm.utils.compat import has_fused_adamw
    optimizer = cfg.optim_wrapper.get('optimizer', {})
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if optimizer.get('type') == 'AdamW' and has_fused_adamw(device):
        optimizer.pop('foreach', None)
        optimizer['fused'] = True


def train_job(job_file):
    """Runs in a child process (``python -m polaformer_mm.workflows.quickstart JOB_FILE``):
    what tools/train.py does, then what tools/test.py --out does on the checkpoint it
    wrote, then the drawing; each stage timed. Evaluating here, not in the parent, lets one
    job's evaluation run while the other one still trains."""
    with open(job_file) as f:
        job = json.load(f)
    cfg, path = _config(job, 'train')
    entry.prepare_train_config(cfg, path, work_dir=job['train_dir'])
    _fused_optimizer(cfg)
    # no validation during training: the evaluation below takes the last checkpoint
    cfg.train_cfg.val_interval = 10**9
    cfg.train_cfg.val_begin = 10**9  # mmengine also validates after the last epoch/iteration
    rss_start = _rss_mib()
    t0 = time.perf_counter()
    runner = entry.build_runner(cfg)
    runner.train()
    info = dict(
        train_seconds=round(time.perf_counter() - t0, 1),
        start_rss_mib=rss_start,
        peak_rss_mib=_peak_rss_mib(),  # training's, before the evaluation's runner exists
        iterations=runner.iter)
    del runner
    with open(osp.join(job['train_dir'], 'last_checkpoint')) as f:
        info['checkpoint'] = f.read().strip()
    t0 = time.perf_counter()
    info['metrics'], info['predictions'] = evaluate(job, info['checkpoint'])
    info['eval_seconds'] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    info['drawing'] = draw(job, info['predictions'])
    info['draw_seconds'] = round(time.perf_counter() - t0, 1)
    with open(job['result_file'], 'w') as f:
        json.dump(info, f)


def _start_training(job, threads, quiet):
    """Start one training child process; returns (Popen, job with its result file)."""
    os.makedirs(job['train_dir'], exist_ok=True)
    job = dict(job, result_file=osp.join(job['train_dir'], 'quickstart_train.json'))
    if osp.exists(job['result_file']):
        os.remove(job['result_file'])
    job_file = osp.join(job['train_dir'], 'quickstart_job.json')
    with open(job_file, 'w') as f:
        json.dump(job, f)
    env = dict(os.environ)
    # the child imports this package from where this process did
    package_parent = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    env['PYTHONPATH'] = os.pathsep.join(p for p in (package_parent, env.get('PYTHONPATH')) if p)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    out = None
    if quiet:  # jobs side by side: each one's console output into its own file
        job['console_log'] = osp.join(job['train_dir'], 'console.log')
        out = open(job['console_log'], 'w')
    try:
        proc = subprocess.Popen(
            [sys.executable, '-m', 'polaformer_mm.workflows.quickstart', job_file],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None)
    finally:
        if out:
            out.close()
    return proc, job


def _job_result(job, returncode):
    """What a finished child left: its timings, peak RSS, checkpoint, metrics, drawing."""
    if returncode != 0 or not osp.exists(job['result_file']):
        where = job.get('console_log') or f'the log under {job["train_dir"]}'
        raise RuntimeError(f'training {job["task"]} ({job["variant"]}) failed with exit code '
                           f'{returncode}; see {where}')
    with open(job['result_file']) as f:
        return json.load(f)


def default_parallel_jobs():
    """How many training jobs run side by side by default: one on a GPU; on a CPU two where
    there are two cores or more (these small models use several threads badly, two
    single-threaded jobs keep two cores busy)."""
    import torch
    if torch.cuda.is_available():
        return 1
    return min(2, os.cpu_count() or 1)


def run_all(jobs, parallel):
    """Train and evaluate every job, ``parallel`` child processes at a time (CPU threads
    split among them); returns {(task, variant): info} with each child's timings, peak
    RSS, metrics and drawing."""
    pending, running, infos = list(jobs), {}, {}
    threads = max(1, (os.cpu_count() or 1) // parallel) if parallel > 1 else None
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.pop(0)
                proc, job = _start_training(job, threads, quiet=parallel > 1)
                running[proc.pid] = (proc, job)
                where = f' (console: {job["console_log"]})' if parallel > 1 else ''
                print(
                    f'--- {TASKS[job["task"]]["name"]} ({job["variant"]}): training, then '
                    f'evaluating{where}',
                    flush=True)
            pid, status = os.waitpid(-1, 0)
            if pid not in running:
                continue
            proc, job = running.pop(pid)
            proc.returncode = os.waitstatus_to_exitcode(status)
            info = _job_result(job, proc.returncode)
            infos[(job['task'], job['variant'])] = info
            print(
                f'--- {TASKS[job["task"]]["name"]} ({job["variant"]}): trained in '
                f'{info["train_seconds"]} s, evaluated in {info["eval_seconds"]} s',
                flush=True)
    finally:
        for proc, _ in running.values():  # an error or Ctrl-C: no orphans
            proc.kill()
            proc.wait()
    return infos


# ----------------------------------------------------------------------------- evaluation
def _per_class_iou_metric():
    """mmseg's IoUMetric, also returning each class's IoU as ``IoU.<class>`` (percent)."""
    from mmseg.evaluation import IoUMetric
    from mmseg.registry import METRICS

    name = 'QuickstartIoUMetric'
    if name in METRICS.module_dict:
        return name

    class QuickstartIoUMetric(IoUMetric):
        """IoUMetric with each class's IoU in its results."""

        def total_area_to_metrics(self, *args, **kwargs):
            """IoUMetric's, remembered for :meth:`compute_metrics`."""
            self._areas_metrics = IoUMetric.total_area_to_metrics(*args, **kwargs)
            return self._areas_metrics

        def compute_metrics(self, results):
            """IoUMetric's metrics and ``IoU.<class>`` for each class."""
            metrics = super().compute_metrics(results)
            for cls, iou in zip(self.dataset_meta['classes'], self._areas_metrics['IoU']):
                metrics[f'IoU.{cls}'] = round(float(iou) * 100, 2)
            return metrics

    METRICS.register_module(name=name, module=QuickstartIoUMetric)
    return name


def evaluate(job, checkpoint):
    """What tools/test.py --out does; returns the metrics and where predictions went."""
    cfg, path = _config(job, 'test')
    if job['task'] == 'det':
        out = osp.join(job['test_dir'], 'predictions.pkl')
    else:
        out = osp.join(job['test_dir'], 'pred_png')
    entry.prepare_test_config(cfg, path, checkpoint, work_dir=job['test_dir'], out=out)
    if job['task'] == 'seg':
        cfg.test_evaluator.type = _per_class_iou_metric()
    metrics = entry.build_runner(cfg).test()
    return {k: float(v) for k, v in metrics.items()}, out


# ----------------------------------------------------------------------------- drawing
def _palette(job):
    from polaformer_mm.datasets import SYNTHETIC_PALETTE, SYNTHETIC_SEG_PALETTE
    return SYNTHETIC_PALETTE if job['task'] == 'det' else SYNTHETIC_SEG_PALETTE


def _label(img, text, org, colour):
    import cv2
    cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 3, cv2.LINE_AA)
    cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, 0.4, colour, 1, cv2.LINE_AA)


def _draw_instances(image, masks, boxes, labels, scores, classes, palette):
    """image: RGB uint8 (already upscaled); masks at the original size; boxes xyxy."""
    import cv2
    import numpy as np
    out = image.astype(np.float32)
    for mask, label in zip(masks, labels):
        big = cv2.resize(
            mask.astype(np.uint8), image.shape[1::-1], interpolation=cv2.INTER_NEAREST).astype(bool)
        out[big] = 0.5 * out[big] + 0.5 * np.array(palette[label], np.float32)
    out = out.astype(np.uint8)
    for box, label, score in zip(boxes, labels, scores):
        x0, y0, x1, y1 = (int(round(v * SCALE)) for v in box)
        colour = tuple(int(c) for c in palette[label])
        cv2.rectangle(out, (x0, y0), (x1, y1), colour, 2)
        text = classes[label] if score is None else f'{classes[label]} {score:.2f}'
        _label(out, text, (x0 + 2, max(y0 - 3, 10)), colour)
    return out


def _pairs_det(job, predictions, num):
    import cv2
    import numpy as np
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    from polaformer_mm.datasets import SYNTHETIC_CLASSES
    palette = _palette(job)
    coco = COCO(osp.join(job['data_root'], 'annotations/instances_val.json'))
    with open(predictions, 'rb') as f:
        preds = {p['img_id']: p for p in pickle.load(f)}
    for img_id in sorted(coco.getImgIds())[:num]:
        info = coco.loadImgs(img_id)[0]
        image = cv2.imread(osp.join(job['data_root'], 'images/val', info['file_name']))
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        big = cv2.resize(image, None, fx=SCALE, fy=SCALE, interpolation=cv2.INTER_NEAREST)
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
        gt = _draw_instances(
            big, [coco.annToMask(a) for a in anns],
            [[a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2], a['bbox'][1] + a['bbox'][3]]
             for a in anns], [a['category_id'] - 1
                              for a in anns], [None] * len(anns), SYNTHETIC_CLASSES, palette)
        pred = preds[img_id]['pred_instances']
        keep = np.flatnonzero(np.asarray(pred['scores']) >= job['score_thr'])
        masks = [mask_utils.decode(pred['masks'][i]) for i in keep] if 'masks' in pred else []
        drawn = _draw_instances(big, masks,
                                np.asarray(pred['bboxes'])[keep],
                                np.asarray(pred['labels'])[keep],
                                np.asarray(pred['scores'])[keep], SYNTHETIC_CLASSES, palette)
        yield gt, drawn


def _pairs_seg(job, pred_dir, num):
    import cv2
    import numpy as np
    palette = np.array(_palette(job), np.float32)
    names = sorted(os.listdir(osp.join(job['data_root'], 'images/val')))[:num]
    for name in names:
        stem = osp.splitext(name)[0]
        image = cv2.cvtColor(
            cv2.imread(osp.join(job['data_root'], 'images/val', name)), cv2.COLOR_BGR2RGB)
        big = cv2.resize(
            image, None, fx=SCALE, fy=SCALE, interpolation=cv2.INTER_NEAREST).astype(np.float32)
        out = []
        for path in (osp.join(job['data_root'], 'seg_maps/val',
                              stem + '.png'), osp.join(pred_dir, stem + '.png')):
            labels = cv2.imread(path, cv2.IMREAD_UNCHANGED)
            labels = cv2.resize(labels, None, fx=SCALE, fy=SCALE, interpolation=cv2.INTER_NEAREST)
            # the classes in solid colours over the dimmed image: the same drawing for
            # ground truth and prediction, so that they compare at a glance
            fg = labels > 0
            drawn = 0.6 * big
            drawn[fg] = palette[labels[fg]]
            out.append(drawn.astype(np.uint8))
        yield out


def draw(job, predictions):
    """One PNG: ground truth beside prediction for the first validation images."""
    import cv2
    import numpy as np
    pairs = list((_pairs_det if job['task'] == 'det' else _pairs_seg)(job, predictions,
                                                                      job['num_draw']))
    if not pairs:
        return None
    h, w = pairs[0][0].shape[:2]
    gap, head = 6, 22
    cols = 2 if len(pairs) > 1 else 1
    rows = (len(pairs) + cols - 1) // cols
    cell_w = 2 * w + gap
    canvas = np.full((head + rows * (h + gap), cols * (cell_w + 3 * gap), 3), 255, np.uint8)
    thr = f' (score >= {job["score_thr"]:g})' if job['task'] == 'det' else ''
    for c in range(cols):
        x = c * (cell_w + 3 * gap)
        cv2.putText(canvas, 'ground truth', (x + 4, 15), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0),
                    1, cv2.LINE_AA)
        cv2.putText(canvas, 'prediction' + thr, (x + w + gap + 4, 15), cv2.FONT_HERSHEY_SIMPLEX,
                    0.45, (0, 0, 0), 1, cv2.LINE_AA)
    for i, (gt, pred) in enumerate(pairs):
        y = head + (i // cols) * (h + gap)
        x = (i % cols) * (cell_w + 3 * gap)
        canvas[y:y + h, x:x + w] = gt
        canvas[y:y + h, x + w + gap:x + 2 * w + gap] = pred
    path = osp.join(job['work_dir'], 'predictions.png')
    cv2.imwrite(path, cv2.cvtColor(canvas, cv2.COLOR_RGB2BGR))
    return osp.abspath(path)


# ----------------------------------------------------------------------------- main
def summary_row(job, info):
    """One job's summary row: what it ran and what its child process reported."""
    return dict(
        config=TASKS[job['task']]['config'], variant=job['variant'], options=job['options'], **info)


def make_jobs(tasks: Iterable[str],
              compare: bool,
              data_root: str,
              work_dir: str,
              score_thr: float,
              num_draw: int,
              cfg_options: Optional[dict] = None,
              task_options: Optional[Dict[str, dict]] = None):
    """The training jobs: each task, and with ``compare`` its softmax counterpart, with the
    overrides of every task (``cfg_options``) and of the task (``task_options[task]``)."""
    for task in tasks:
        for variant in (('pola', 'softmax') if compare else ('pola', )):
            options = dict(cfg_options or {})
            options.update((task_options or {}).get(task) or {})
            options.update(VARIANTS[variant])
            wd = osp.join(work_dir, task if variant == 'pola' else f'{task}_{variant}')
            yield dict(
                task=task,
                variant=variant,
                options=options,
                data_root=osp.abspath(data_root),
                work_dir=wd,
                train_dir=osp.join(wd, 'train'),
                test_dir=osp.join(wd, 'test'),
                score_thr=score_thr,
                num_draw=num_draw)


def _fmt(value, key):
    if value is None:
        return '-'
    return f'{value:.3f}' if key.startswith('coco/') else f'{value:.2f}'


def format_table(results, compare):
    """The printed summary: one column per variant."""
    variants = ('pola', 'softmax') if compare else ('pola', )
    heads = {'pola': 'Pola (LLLL)', 'softmax': 'softmax (SSSS)'}
    lines = [f'{"model":<14} {"metric (val)":<17}' + ''.join(f'{heads[v]:>16}' for v in variants)]
    for task in TASKS:
        rows = {v: results.get((task, v)) for v in variants}
        if rows['pola'] is None:
            continue
        name = TASKS[task]['name']
        for key, label in TASKS[task]['metrics']:
            cells = ''.join(f'{_fmt(r["metrics"].get(key) if r else None, key):>16}'
                            for r in rows.values())
            lines.append(f'{name:<14} {label:<17}{cells}')
            name = ''
        for key, label in (('train_seconds', 'train time (s)'), ('peak_rss_mib', 'peak RSS (MiB)')):
            cells = ''.join(f'{("-" if r is None else r[key]):>16}' for r in rows.values())
            lines.append(f'{"":<14} {label:<17}{cells}')
    return '\n'.join(lines)


def format_stages(data_seconds, results, total):
    """The per-stage times: data, then each job's training, evaluation and drawing."""
    parts = [f'data {data_seconds:.0f} s']
    for (task, variant), r in results.items():
        parts.append(f'{TASKS[task]["name"]} ({variant}): train {r["train_seconds"]:.0f} s, '
                     f'evaluate {r["eval_seconds"]:.0f} s, draw {r["draw_seconds"]:.0f} s')
    return 'stages (jobs side by side): ' + '; '.join(parts) + f'; total {total / 60:.1f} min'


def check_floors(results):
    """Each Pola model's metrics against the floors a working install reaches
    (``FLOORS``); returns the lines to print."""
    lines = []
    for task, floors in FLOORS.items():
        r = results.get((task, 'pola'))
        if r is None:
            continue
        below = [
            f'{label} {_fmt(r["metrics"].get(key), key)} < {_fmt(floor, key)}'
            for key, label, floor in floors if (r['metrics'].get(key) or 0) < floor
        ]
        met = ', '.join(f'{label} >= {_fmt(floor, key)}' for key, label, floor in floors)
        lines.append(f'{TASKS[task]["name"]}: '
                     + (f'floors met ({met})' if not below else 'BELOW the floors: '
                        + '; '.join(below) + ' (see docs/get_started.md, "Quickstart")'))
    return lines


def _write_summary(work_dir, results, info, data_seconds, total):
    """``<work_dir>/summary.json``: every job's row, the data and the times; returns its
    path."""
    os.makedirs(work_dir, exist_ok=True)
    summary = osp.join(work_dir, 'summary.json')
    with open(summary, 'w') as f:
        json.dump(
            dict(
                results={
                    f'{t}/{v}': r
                    for (t, v), r in results.items()
                },
                data=dict(root=info['root'], args=info['args']),
                data_seconds=round(data_seconds, 1),
                total_seconds=round(total, 1)),
            f,
            indent=2)
    return summary


def run_quickstart(tasks: Iterable[str] = ('det', 'seg'),
                   compare: bool = False,
                   data_root: str = 'data/synthetic',
                   work_dir: str = 'work_dirs/quickstart',
                   num_train: int = SYNTHETIC_DEFAULTS['num_train'],
                   num_val: int = SYNTHETIC_DEFAULTS['num_val'],
                   score_thr: float = 0.5,
                   num_draw: int = 8,
                   jobs: Optional[int] = None,
                   cfg_options: Optional[dict] = None,
                   task_options: Optional[Dict[str, dict]] = None) -> dict:
    """The quickstart (``tools/quickstart.py`` documents the arguments): generate the data,
    train and evaluate every job (``jobs`` child processes side by side; default
    :func:`default_parallel_jobs`), print the summary and write it to
    ``<work_dir>/summary.json``. Returns {(task, variant): summary row}."""
    tasks = list(tasks)
    t0 = time.time()
    # rendered by forked processes: nothing has run in this one yet
    workers = min(4, os.cpu_count() or 1)
    info = generate_synthetic_dataset(
        data_root, num_train=num_train, num_val=num_val, workers=workers)
    data_seconds = time.time() - t0
    print(f"synthetic data: {data_root} "
          f"({'generated' if info['generated'] else 'already there'}: "
          f"{info['splits']['train']['images']} train, {info['splits']['val']['images']} val "
          f"images of {info['args']['img_size'][0]}x{info['args']['img_size'][1]}) "
          f'in {data_seconds:.0f} s')
    job_list = list(
        make_jobs(tasks, compare, data_root, work_dir, score_thr, num_draw, cfg_options,
                  task_options))
    parallel = min(jobs or default_parallel_jobs(), len(job_list))
    infos = run_all(job_list, parallel)
    results = {}
    for job in job_list:
        key = (job['task'], job['variant'])
        results[key] = summary_row(job, infos[key])
    total = time.time() - t0
    summary = _write_summary(work_dir, results, info, data_seconds, total)
    print('\n' + '=' * 72)
    print(format_table(results, compare))
    print('peak RSS: the training process, Python and libraries included')
    for (task, variant), r in results.items():
        print(f'{task} ({variant}): ground truth | prediction in {r["drawing"]}')
    print(format_stages(data_seconds, results, total))
    if not compare and set(tasks) == set(TASKS):
        print(EXPECTED)
    for line in check_floors(results):
        print(line)
    print(f'summary in {summary}')
    return results


if __name__ == '__main__':
    train_job(sys.argv[1])
