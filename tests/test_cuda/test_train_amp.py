"""One training iteration through ``tools/train.py --amp`` and ``tools/test.py`` on its
checkpoint, for Mask R-CNN, RetinaNet and Semantic FPN with Pola-PVT-T and UperNet with
Pola-Swin-T, on synthetic data (tests/_smoke.py points the configs at it).

CUDA case: the configs' own image sizes (1333x800 detection, 512x512 segmentation
crops), mixed precision (mmengine ``AmpOptimWrapper``, whose loss scaler lands in the
checkpoint). CPU case: the reduced sizes of the smoke tests, float32 (``--amp`` needs
CUDA), for RetinaNet and Semantic FPN. Both: the loss and the saved weights are finite,
and ``tools/test.py`` evaluates the checkpoint and writes one prediction per test image.
"""
import copy
import glob
import importlib.util
import json
import math
import os
import os.path as osp
import pickle

import pytest
import torch

for _module in ('mmdet.models', 'mmseg.models', 'pycocotools'):  # a bare GPU machine may lack them
    pytest.importorskip(_module, reason=f'the training tests need {_module}')

from polaformer_mm.engine import entry  # noqa: E402
from polaformer_mm.utils.mmcv_ops import mmcv_cuda_ops_version  # noqa: E402
from tests import REPO  # noqa: E402
from .._smoke import smoke_config  # noqa: E402
from ._devices import cuda_param  # noqa: E402

pytestmark = pytest.mark.slow

CONFIGS = [
    'configs/pola_pvt/mask-rcnn_pola-pvt-t_fpn_1x_coco.py',
    'configs/pola_pvt/retinanet_pola-pvt-t_fpn_1x_coco.py',
    'configs/pola_pvt/fpn_pola-pvt-t_8xb2-40k_ade20k-512x512.py',
    'configs/pola_swin/upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py',
]


def _load_tool(name):
    spec = importlib.util.spec_from_file_location(f'_tool_{name}',
                                                  osp.join(REPO, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _loaders(cfg):
    return [cfg[f'{split}_dataloader'] for split in ('train', 'val', 'test')]


def _innermost(dataset):
    while 'dataset' in dataset:
        dataset = dataset['dataset']
    return dataset


def _config_file(path, data_root, work_dir, full_size):
    """The smoke version of ``path`` (optionally at the config's own image sizes), with
    a last checkpoint and no validation during training, written to a file."""
    cfg = entry.load_config(osp.join(REPO, path))
    pipelines = [copy.deepcopy(_innermost(loader.dataset).pipeline) for loader in _loaders(cfg)]
    preprocessor_size = cfg.model.data_preprocessor.get('size')
    smoke_config(cfg, data_root, work_dir)
    if full_size:
        for loader, pipeline in zip(_loaders(cfg), pipelines):
            _innermost(loader.dataset).pipeline = pipeline
        if preprocessor_size is not None:
            cfg.model.data_preprocessor.size = preprocessor_size
    cfg.train_cfg.val_interval = 10**9  # tools/test.py evaluates the checkpoint instead
    cfg.default_hooks.checkpoint.save_last = True
    # one visualizer per run (in one process mmengine would hand later runs the first's,
    # which writes into the first run's folder)
    cfg.visualizer.name = f'visualizer_{osp.basename(osp.dirname(str(work_dir)))}'
    os.makedirs(str(work_dir), exist_ok=True)
    out = osp.join(str(work_dir), osp.basename(path))
    cfg.dump(out)
    return out, cfg


def _losses(work_dir):
    files = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    assert files, f'no scalars.json under {work_dir}'
    with open(files[0]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r['loss'] for r in rows if 'loss' in r]


def _cases():
    cases = []
    for path in CONFIGS:
        tag = '-'.join(osp.basename(path).split('_')[:2])
        # CPU: one detector and one segmentor (Mask R-CNN's and UperNet's single
        # iterations on the CPU are in tests/test_engine/test_dense_configs_train.py)
        if tag.split('-')[0] in ('retinanet', 'fpn'):
            cases.append(pytest.param('cpu', path, id=f'cpu-{tag}'))
        cases.append(cuda_param('cuda', path, id=f'cuda-{tag}'))
    return cases


@pytest.mark.parametrize('device,path', _cases())
def test_train_amp_one_iteration_then_test(device, path, synthetic_data_root, tmp_path):
    cuda = device == 'cuda'
    cfg_file, cfg = _config_file(path, synthetic_data_root, tmp_path / 'cfg', full_size=cuda)
    ops = mmcv_cuda_ops_version()
    if cuda and cfg.default_scope == 'mmdet' and ops[1] is None:
        # RoIAlign, NMS and the focal loss of the detectors run as mmcv's CUDA ops
        pytest.skip(f'detection on CUDA needs mmcv built with its CUDA ops: {ops}')
    work_dir = str(tmp_path / 'train')
    args = [cfg_file, '--work-dir', work_dir] + (['--amp'] if cuda else [])
    _load_tool('train').main(args)

    losses = _losses(work_dir)
    assert losses and all(math.isfinite(v) for v in losses), losses
    ckpt_files = glob.glob(osp.join(work_dir, '*.pth'))
    assert len(ckpt_files) == 1, ckpt_files
    ckpt = torch.load(ckpt_files[0], map_location='cpu', weights_only=True)
    assert ckpt['meta']['iter'] == 1
    assert ('loss_scaler' in ckpt['optimizer']) == cuda, 'AmpOptimWrapper iff --amp'
    backbone = {k: v for k, v in ckpt['state_dict'].items() if k.startswith('backbone.')}
    assert backbone and all(
        torch.isfinite(v).all() for v in backbone.values() if v.is_floating_point())

    scope = cfg.default_scope
    out = str(tmp_path / ('preds.pkl' if scope == 'mmdet' else 'preds'))
    metrics = _load_tool('test').main(
        [cfg_file, ckpt_files[0], '--work-dir',
         str(tmp_path / 'test'), '--out', out])
    num_test = _innermost(cfg.test_dataloader.dataset).indices  # set by smoke_config
    if scope == 'mmdet':
        with open(out, 'rb') as f:
            preds = pickle.load(f)
        assert len(preds) == num_test and all('pred_instances' in p for p in preds)
        # CocoMetric returns {} when an untrained detector keeps no box
        assert not metrics or 'coco/bbox_mAP' in metrics, metrics
    else:
        assert 'mIoU' in metrics, metrics
        assert len(glob.glob(osp.join(out, '*.png'))) == num_test
