"""Point any dense config of the project at the synthetic data, at a small image scale.

The result trains for one iteration and validates on one image with the config's own
model, pipeline transforms, optimizer and metric; only data paths, class count, image
sizes, batch sizes, schedule length and pretrained-weight paths change.
"""
import copy
import os.path as osp

from polaformer_mm.datasets import SYNTHETIC_CLASSES, generate_synthetic_dataset

SMALL = 96  # short side of the reduced image scale
LONG = 128  # long side


def synthetic_root(tmp_root):
    root = osp.join(str(tmp_root), 'synthetic')
    generate_synthetic_dataset(root, num_train=4, num_val=2, img_size=(112, 144), seed=3)
    return root + '/'


def _shrink_transform(t):
    t = copy.deepcopy(t)
    for key, value in list(t.items()):
        if key in ('scale', 'img_scale') and isinstance(value, (tuple, list)):
            t[key] = (LONG, SMALL) if value[0] >= value[1] else (SMALL, LONG)
        elif key == 'scales' and isinstance(value, (tuple, list)):
            t[key] = [(LONG, SMALL)]
        elif key == 'crop_size':
            t[key] = (SMALL, SMALL)
        elif key == 'transforms' and isinstance(value, (tuple, list)):
            t[key] = [_shrink_pipeline(v) if isinstance(v, (list, tuple))
                      else _shrink_transform(v) for v in value]
    return t


def _shrink_pipeline(pipeline):
    return [_shrink_transform(t) for t in pipeline]


def _innermost(dataset):
    while 'dataset' in dataset:  # RepeatDataset, ClassBalancedDataset, ...
        dataset = dataset['dataset']
    return dataset


def _set_num_classes(node, n):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == 'num_classes':
                node[key] = n
            else:
                _set_num_classes(value, n)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _set_num_classes(value, n)


def smoke_config(cfg, data_root, work_dir):
    """Adapt ``cfg`` (an mmdet or mmseg config) in place; returns it."""
    scope = cfg.default_scope
    cfg.work_dir = str(work_dir)
    cfg.launcher = 'none'
    cfg.setdefault('runner_type', 'PolaRunner')
    cfg.load_from = None
    cfg.resume = False
    backbone = cfg.model.backbone
    backbone.init_cfg = None
    if 'pretrained' in backbone:
        backbone.pretrained = None
    if 'pretrained' in cfg.model:
        cfg.model.pretrained = None
    for split, subset in (('train', 'train'), ('val', 'val'), ('test', 'val')):
        loader = cfg[f'{split}_dataloader']
        loader.batch_size = 1
        loader.num_workers = 0
        loader.persistent_workers = False
        ds = _innermost(loader.dataset)
        ds.data_root = data_root
        ds.indices = 1
        ds.pipeline = _shrink_pipeline(ds.pipeline)
        if scope == 'mmdet':
            ds.ann_file = f'annotations/instances_{subset}.json'
            ds.data_prefix = dict(img=f'images/{subset}/')
            ds.metainfo = dict(classes=SYNTHETIC_CLASSES)
        else:  # ADE20K-style: background (0) ignored, shapes are classes 0..2
            # (ADE20KDataset only accepts subsets of its 150 names; its parent reads any)
            ds.type = 'BaseSegDataset'
            ds.data_prefix = dict(img_path=f'images/{subset}', seg_map_path=f'seg_maps/{subset}')
            ds.img_suffix = '.jpg'
            ds.seg_map_suffix = '.png'
            ds.reduce_zero_label = True
            ds.metainfo = dict(classes=SYNTHETIC_CLASSES)
    for key in ('val_evaluator', 'test_evaluator'):
        evaluators = cfg[key] if isinstance(cfg[key], list) else [cfg[key]]
        for ev in evaluators:
            if 'ann_file' in ev:
                ev.ann_file = osp.join(data_root, 'annotations/instances_val.json')
    _set_num_classes(cfg.model, len(SYNTHETIC_CLASSES))
    if scope == 'mmseg' and 'size' in cfg.model.data_preprocessor:
        cfg.model.data_preprocessor.size = (SMALL, SMALL)
    if cfg.train_cfg.get('type') == 'IterBasedTrainLoop' or 'max_iters' in cfg.train_cfg:
        cfg.train_cfg.max_iters = 1
    else:
        cfg.train_cfg.max_epochs = 1
    cfg.train_cfg.val_interval = 1
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.checkpoint.interval = 10**9
    cfg.default_hooks.checkpoint.save_last = False
    return cfg
