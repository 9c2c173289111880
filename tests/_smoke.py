"""Point any dense config of the project at the synthetic data, at a small image scale.

The result trains for one iteration and validates on one image with the config's own
model, pipeline transforms, optimizer and metric; only data paths, class count, image
sizes, batch sizes, schedule length and pretrained-weight paths change.
"""
import copy
import json
import os
import os.path as osp
import re

import cv2

from polaformer_mm.datasets import (SYNTHETIC_CLASSES, generate_synthetic_dataset,
                                    write_cityscapes_layout)
from tests import REPO

SMALL = 96  # short side of the reduced image scale
LONG = 128  # long side


def synthetic_root(tmp_root):
    root = osp.join(str(tmp_root), 'synthetic')
    generate_synthetic_dataset(root, num_train=4, num_val=2, img_size=(112, 144), seed=3)
    write_cityscapes_layout(root)  # root/cityscapes: the Cityscapes configs' data
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
            t[key] = [
                _shrink_pipeline(v) if isinstance(v, (list, tuple)) else _shrink_transform(v)
                for v in value
            ]
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
            if key in ('num_classes', 'num_things_classes'):
                node[key] = n
            elif key == 'class_weight' and isinstance(value, list) and len(value) > n + 1:
                node[key] = value[:n] + value[-1:]  # Mask2Former: the classes, then "no object"
            else:
                _set_num_classes(value, n)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _set_num_classes(value, n)


def smoke_config(cfg, data_root, work_dir):
    """Adapt ``cfg`` (an mmdet or mmseg config) in place; returns it."""
    scope = cfg.default_scope
    _runtime(cfg, work_dir)
    backbone = cfg.model.backbone
    if 'pretrained' in backbone:
        backbone.pretrained = None
    if 'pretrained' in cfg.model:
        cfg.model.pretrained = None
    for split, subset in (('train', 'train'), ('val', 'val'), ('test', 'val')):
        # segmentation heads with BN on pooled maps (UperNet's PPM) need 2 images
        n = 2 if scope == 'mmseg' and split == 'train' else 1
        loader = _small_loader(cfg, split, n)
        ds = _innermost(loader.dataset)
        ds.data_root = data_root
        ds.indices = n
        ds.pipeline = _shrink_pipeline(ds.pipeline)
        if scope == 'mmdet':
            ds.ann_file = f'annotations/instances_{subset}.json'
            ds.data_prefix = dict(img=f'images/{subset}/')
            ds.metainfo = dict(classes=SYNTHETIC_CLASSES)
        elif ds.type == 'ADE20KDataset':  # background (0) ignored, shapes are classes 0..2
            # (ADE20KDataset only accepts subsets of its 150 names; its parent reads any)
            ds.type = 'BaseSegDataset'
            ds.data_prefix = dict(img_path=f'images/{subset}', seg_map_path=f'seg_maps/{subset}')
            ds.img_suffix = '.jpg'
            ds.seg_map_suffix = '.png'
            ds.reduce_zero_label = True
            ds.metainfo = dict(classes=SYNTHETIC_CLASSES)
        elif ds.type == 'CityscapesDataset':  # its 19 classes, its layout
            ds.data_root = osp.join(data_root, 'cityscapes/')
    for key in ('val_evaluator', 'test_evaluator'):
        evaluators = cfg[key] if isinstance(cfg[key], list) else [cfg[key]]
        for ev in evaluators:
            if 'ann_file' in ev:
                ev.ann_file = osp.join(data_root, 'annotations/instances_val.json')
    if scope == 'mmdet' or 'ade20k' in cfg.filename:  # the quickstart's own classes stay
        _set_num_classes(cfg.model, len(SYNTHETIC_CLASSES))
    if scope == 'mmseg' and 'size' in cfg.model.data_preprocessor:
        cfg.model.data_preprocessor.size = (SMALL, SMALL)
    for augment in cfg.model.data_preprocessor.get('batch_augments') or []:
        if 'size' in augment:  # Mask2Former's BatchFixedSizePad to its crop
            augment.size = (SMALL, SMALL)
    _one_step(cfg)
    return cfg


def _runtime(cfg, work_dir):
    cfg.work_dir = str(work_dir)
    cfg.launcher = 'none'
    cfg.setdefault('runner_type', 'PolaRunner')
    cfg.load_from = None
    cfg.resume = False
    cfg.model.backbone.init_cfg = None


def _small_loader(cfg, split, batch_size):
    loader = cfg[f'{split}_dataloader']
    loader.batch_size = batch_size
    loader.num_workers = 0
    loader.persistent_workers = False
    return loader


def _one_step(cfg):
    """One training iteration, then one validation pass; no checkpoints."""
    if cfg.train_cfg.get('type') == 'IterBasedTrainLoop' or 'max_iters' in cfg.train_cfg:
        cfg.train_cfg.max_iters = 1
    else:
        cfg.train_cfg.max_epochs = 1
    cfg.train_cfg.val_interval = 1
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.checkpoint.interval = 10**9
    cfg.default_hooks.checkpoint.save_last = False


def classification_root(tmp_root):
    """Crops of the synthetic shapes in class folders (``{train,val}/<class>/*.jpg``), the
    layout mmpretrain's ``CustomDataset`` reads."""
    det_root = synthetic_root(tmp_root)
    root = osp.join(str(tmp_root), 'synthetic_cls')
    if osp.isdir(root):
        return root + '/'
    for split in ('train', 'val'):
        with open(osp.join(det_root, f'annotations/instances_{split}.json')) as f:
            coco = json.load(f)
        files = {im['id']: im['file_name'] for im in coco['images']}
        names = {c['id']: c['name'] for c in coco['categories']}
        for ann in coco['annotations']:
            x, y, w, h = ann['bbox']
            img = cv2.imread(osp.join(det_root, 'images', split, files[ann['image_id']]))
            out = osp.join(root, split, names[ann['category_id']])
            os.makedirs(out, exist_ok=True)
            cv2.imwrite(osp.join(out, f"{ann['id']:06d}.jpg"), img[y:y + h, x:x + w])
    return root + '/'


def _shrink_cls_transform(t, size=64):
    t = copy.deepcopy(t)
    if t['type'] in ('RandomResizedCrop', 'ResizeEdge') and isinstance(t.get('scale'), int):
        t['scale'] = size if t['type'] == 'RandomResizedCrop' else size + size // 8
    if 'crop_size' in t:
        t['crop_size'] = size
    return t


def smoke_classification_config(cfg, data_root, work_dir):
    """An mmpretrain config on the synthetic crops: one iteration, one validation pass."""
    _runtime(cfg, work_dir)
    for split, subset in (('train', 'train'), ('val', 'val'), ('test', 'val')):
        loader = _small_loader(cfg, split, 2)
        pipeline = [_shrink_cls_transform(t) for t in loader.dataset.pipeline]
        loader.dataset = dict(
            type='CustomDataset',
            data_root=data_root,
            data_prefix=subset,
            with_label=True,
            indices=2,
            pipeline=pipeline)
    _one_step(cfg)
    # the 20-epoch warm-up and the cosine after it, both squeezed into the one epoch
    schedulers = cfg.param_scheduler
    for s in schedulers if isinstance(schedulers, list) else [schedulers]:
        s.pop('begin', None)
        s.pop('end', None)
    return cfg


def _cli_value(value):
    """``value`` as mmengine's DictAction (``--cfg-options``) reads it back."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        if not value or any(c in value for c in ' ,()[]\'"'):
            raise ValueError(f'{value!r} cannot be written as a --cfg-options value')
        return value
    if isinstance(value, (list, tuple)):
        items = ','.join(_cli_value(v) for v in value)
        return f'({items})' if isinstance(value, tuple) else f'[{items}]'
    raise ValueError(f'{value!r} cannot be written as a --cfg-options value')


def _diff(old, new, key, out):
    if isinstance(new, dict):
        if not isinstance(old, dict):
            old = {}
        gone = set(old) - set(new)
        if gone:
            raise ValueError(f'{key}: keys {sorted(gone)} removed; not expressible')
        for k, v in new.items():
            _diff(old.get(k, _MISSING), v, f'{key}.{k}' if key else k, out)
    elif (isinstance(new, (list, tuple)) and isinstance(old, (list, tuple)) and len(old) == len(new)
          and any(isinstance(v, dict) for v in new)):
        for i, (a, b) in enumerate(zip(old, new)):
            _diff(a, b, f'{key}.{i}', out)
    elif old is _MISSING or old != new:
        out[key] = new


_MISSING = object()
# what smoke_config sets that tools/train.py / tools/test.py set themselves
_RUNTIME_KEYS = ('work_dir', 'launcher', 'runner_type', 'load_from', 'resume')


def smoke_cfg_options(config_path, data_root, iters=1):
    """smoke_config as ``--cfg-options`` strings for tools/train.py / tools/test.py: the
    keys it changes in ``config_path``, plus ``iters`` iterations (or epochs), a checkpoint
    after each (the run keeps its final one) and no validation pass."""
    from mmengine.config import Config
    original = Config.fromfile(config_path)
    small = smoke_config(Config.fromfile(config_path), data_root, '/unused')
    loop = small.train_cfg
    key = 'max_iters' if 'max_iters' in loop or loop.get('type') == 'IterBasedTrainLoop' \
        else 'max_epochs'
    loop[key] = iters
    loop.val_begin = iters + 1  # the test tool evaluates
    small.default_hooks.checkpoint.interval = iters
    small.default_hooks.checkpoint.save_last = True
    out = {}
    _diff(original.to_dict(), small.to_dict(), '', out)
    for k in _RUNTIME_KEYS:
        out.pop(k, None)
    return [f'{k}={_cli_value(v)}' for k, v in out.items()]


QUICKSTART_DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')


def two_epoch_det_config(data_root, module, checkpoint='dict(interval=1)', extra=''):
    """Text of a config file: the quickstart Mask R-CNN for two epochs of one iteration on
    the synthetic data, a checkpoint every epoch, importing the test's own ``module``
    (through ``custom_imports``), with ``extra`` lines at the end."""
    return (f"_base_ = [{QUICKSTART_DET!r}]\n"
            f"custom_imports = dict(imports=['polaformer_mm', {module!r}], "
            'allow_failed_imports=False)\n'
            f'data_root = {data_root!r}\n'
            'train_dataloader = dict(batch_size=2, dataset=dict(data_root=data_root, '
            'indices=2))\n'
            'val_dataloader = dict(batch_size=1, dataset=dict(data_root=data_root, '
            'indices=1))\n'
            'test_dataloader = val_dataloader\n'
            "val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')\n"
            'test_evaluator = val_evaluator\n'
            'train_cfg = dict(max_epochs=2, val_interval=100)\n'
            f'default_hooks = dict(logger=dict(interval=1), checkpoint={checkpoint})\n' + extra)


#: ``POLA_TEST_TRAINS``: which configs the one-iteration config trains run (``make test``
#: sets it per stack; see ``configs_to_train``)
TRAINS_ENV = 'POLA_TEST_TRAINS'
TRAIN_MODES = ('all', 'one-per-size-family', 'one-per-pair')
_SIZE_RANK = {
    s: i
    for i, names in enumerate(['t tiny b0', 's small b1', 'm medium b2', 'l large b base'])
    for s in names.split()
}
_SIZE = re.compile(
    r'(pvtv2|pvt|swin|deit)-(tiny|small|medium|large|base|b[0-5](?![0-9])|[tsmlb])(16)?')

_BATCH = re.compile(r'[0-9]+xb[0-9]+')  # GPUs x images per GPU


def _train_group(path, mode):
    """The group of ``path`` whose smallest backbone ``mode`` trains: the configs whose names
    differ only in the backbone size ('one-per-size-family'), or those of one detector,
    segmentor or classifier recipe on one backbone family, whatever the size, data set or
    schedule: the first two fields of the name, sizes and GPU x batch left out
    ('one-per-pair': Mask R-CNN with Pola-PVT, Mask R-CNN with PVT, UperNet with Pola-Swin,
    ImageNet from scratch with Pola-DeiT, ImageNet fine-tuning with Pola-DeiT, ...)."""
    name = _SIZE.sub(r'\1-X', os.path.basename(path))
    if mode == 'one-per-pair':
        name = '_'.join(_BATCH.sub('N', name).split('_')[:2])
    return os.path.dirname(path), name


def configs_to_train(paths):
    """The config paths the one-iteration train tests run, by ``POLA_TEST_TRAINS``: 'all'
    (the default), 'one-per-size-family' or 'one-per-pair' (the smallest backbone of each
    group of ``_train_group``; the same code paths in a fraction of the time: every config
    is still built, its optimizer too, by tests/test_configs on both stacks)."""
    mode = os.environ.get(TRAINS_ENV, 'all')
    if mode not in TRAIN_MODES:
        raise ValueError(f'{TRAINS_ENV} must be one of {TRAIN_MODES}, got {mode!r}')
    if mode == 'all':
        return list(paths)
    smallest = {}
    for path in sorted(paths):
        group = _train_group(path, mode)
        sizes = [m[2] for m in _SIZE.finditer(os.path.basename(path))]
        rank = _SIZE_RANK.get(sizes[0], len(_SIZE_RANK)) if sizes else 0
        if group not in smallest or rank < smallest[group][0]:
            smallest[group] = (rank, path)
    return sorted(path for _, path in smallest.values())
