#!/usr/bin/env python
"""Quickstart: the whole pipeline on the bundled synthetic data, in minutes on a laptop.

    python tools/quickstart.py [--data-root data/synthetic] [--work-dir work_dirs/quickstart]
                               [--tasks det seg] [--cfg-options k=v ...]

For each task (det: Mask R-CNN + Pola-PVT-T, seg: Semantic FPN + Pola-PVT-T;
configs/quickstart/) it

1. generates the synthetic dataset if it is missing (deterministic, a few seconds);
2. evaluates the untrained model (the same initialisation training starts from) with the
   real metric (CocoMetric bbox + segm / IoUMetric);
3. trains it with mmengine's Runner (a GPU is used when there is one);
4. evaluates the trained checkpoint the same way and writes prediction images;

then prints both rows side by side and writes them to ``<work-dir>/summary.json``.
"""
import argparse
import json
import os
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

# isort: off
import polaformer_mm  # noqa: E402,F401  (before torchvision)
from mmengine.config import DictAction  # noqa: E402
from polaformer_mm.datasets import generate_synthetic_dataset  # noqa: E402
from polaformer_mm.engine import entry  # noqa: E402
# isort: on

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TASKS = {
    'det':
    dict(
        config='configs/quickstart/mask-rcnn_pola-pvt-t_fpn_synthetic.py',
        metrics=('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50')),
    'seg':
    dict(config='configs/quickstart/fpn_pola-pvt-t_synthetic-seg.py', metrics=('mIoU', 'aAcc')),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--data-root', default='data/synthetic')
    p.add_argument('--work-dir', default='work_dirs/quickstart')
    p.add_argument('--tasks', nargs='+', choices=sorted(TASKS), default=['det', 'seg'])
    p.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='overrides applied to every task config')
    return p.parse_args(argv)


def _set_data_root(cfg, data_root):
    root = data_root.rstrip('/') + '/'
    for split in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[split].dataset.data_root = root
    for ev in ('val_evaluator', 'test_evaluator'):
        if 'ann_file' in cfg[ev]:
            cfg[ev].ann_file = osp.join(root, osp.relpath(cfg[ev].ann_file, cfg.data_root))


def _config(task, data_root, phase, cfg_options):
    path = osp.join(REPO, TASKS[task]['config'])
    cfg = entry.load_config(path, cfg_options)
    _set_data_root(cfg, data_root)
    cfg.experiment_name = f'{task}_{phase}_{time.strftime("%Y%m%d_%H%M%S")}'
    # visualizers are named singletons: one per phase, so each writes to its own folder
    cfg.visualizer.name = cfg.experiment_name
    return cfg, path


def _metrics(task, result):
    return {
        k.split('/')[-1] if task == 'seg' else k: float(result[k])
        for k in TASKS[task]['metrics'] if k in result
    }


def run_task(task, args):
    wd = osp.join(args.work_dir, task)
    # 2. untrained: the weights training starts from (same seed, same init_weights)
    cfg, path = _config(task, args.data_root, 'untrained', args.cfg_options)
    entry.prepare_train_config(cfg, path, work_dir=osp.join(wd, 'untrained'))
    runner = entry.build_runner(cfg)
    runner.model.init_weights()
    untrained = runner.test()

    # 3. train (no validation during training: step 4 evaluates)
    cfg, path = _config(task, args.data_root, 'train', args.cfg_options)
    entry.prepare_train_config(cfg, path, work_dir=osp.join(wd, 'train'))
    cfg.train_cfg.val_interval = 10**9
    cfg.train_cfg.val_begin = 10**9  # mmengine also validates after the last epoch/iteration
    t0 = time.time()
    runner = entry.build_runner(cfg)
    runner.train()
    train_s = time.time() - t0
    ckpt = _last_checkpoint(osp.join(wd, 'train'))

    # 4. evaluate the trained checkpoint, drawing predictions
    cfg, path = _config(task, args.data_root, 'test', args.cfg_options)
    show_dir = osp.abspath(osp.join(wd, 'predictions'))
    entry.prepare_test_config(cfg, path, ckpt, work_dir=osp.join(wd, 'test'), show_dir=show_dir)
    trained = entry.build_runner(cfg).test()
    return dict(
        config=TASKS[task]['config'],
        checkpoint=ckpt,
        train_seconds=round(train_s, 1),
        untrained=_metrics(task, untrained),
        trained=_metrics(task, trained),
        predictions=show_dir)


def _last_checkpoint(train_dir):
    with open(osp.join(train_dir, 'last_checkpoint')) as f:
        return f.read().strip()


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    info = generate_synthetic_dataset(args.data_root)
    print(f"synthetic data: {args.data_root} "
          f"({'generated' if info.get('generated') else 'already there'})")
    results = {}
    for task in args.tasks:
        results[task] = run_task(task, args)
    total = time.time() - t0
    os.makedirs(args.work_dir, exist_ok=True)
    with open(osp.join(args.work_dir, 'summary.json'), 'w') as f:
        json.dump(dict(results=results, total_seconds=round(total, 1)), f, indent=2)
    print('\n' + '=' * 72)
    print(f'{"task":<5} {"metric":<16} {"untrained":>10} {"trained":>10}')
    for task, r in results.items():
        for k in r['trained']:
            print(f'{task:<5} {k:<16} {r["untrained"].get(k, float("nan")):>10.4f} '
                  f'{r["trained"][k]:>10.4f}')
    for task, r in results.items():
        print(f'{task}: trained in {r["train_seconds"]:.0f} s; prediction images in '
              f'{r["predictions"]}')
    print(f'total {total / 60:.1f} min; summary in {osp.join(args.work_dir, "summary.json")}')
    return results


if __name__ == '__main__':
    main()
