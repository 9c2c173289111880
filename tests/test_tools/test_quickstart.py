"""tools/quickstart.py end to end on tiny data: a few iterations of each model (and of its
softmax counterpart), the real CocoMetric / IoUMetric, the drawings and the summary; the
parts of polaformer_mm.workflows.quickstart on their own."""
import json
import os.path as osp

import cv2
import pytest
import torch

from polaformer_mm.workflows import quickstart
from .._tools import load_tool

# pycocotools' mask.decode under numpy 2
pytestmark = pytest.mark.filterwarnings('ignore:__array__ implementation:DeprecationWarning')


@pytest.fixture(scope='module')
def quickstart_tool():
    return load_tool('quickstart.py')


def summary_img_size(tmp_path):
    with open(tmp_path / 'data' / 'meta.json') as f:
        return min(json.load(f)['args']['img_size'])


def _state_dict(path):
    return torch.load(path, map_location='cpu', weights_only=True)['state_dict']


@pytest.mark.slow
def test_quickstart_compare_fast(quickstart_tool, tmp_path, capsys):
    work_dir = tmp_path / 'wd'
    argv = [
        '--data-root',
        str(tmp_path / 'data'), '--work-dir',
        str(work_dir), '--num-train', '4', '--num-val', '2', '--num-draw', '2', '--compare',
        '--score-thr', '0', '--cfg-options', 'train_dataloader.batch_size=2',
        'default_hooks.logger.interval=1', '--det-options', 'train_cfg.max_epochs=1',
        '--seg-options', 'train_cfg.max_iters=2'
    ]
    results = quickstart_tool.main(argv)
    out = capsys.readouterr().out
    assert set(results) == {('det', 'pola'), ('det', 'softmax'), ('seg', 'pola'),
                            ('seg', 'softmax')}
    for (task, variant), r in results.items():
        assert r['iterations'] == 2
        assert r['train_seconds'] > 0 and r['eval_seconds'] > 0 and r['draw_seconds'] >= 0
        assert r['peak_rss_mib'] >= r['start_rss_mib'] > 0
        if task == 'det':  # the real CocoMetric, bbox and segm
            assert {'coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP'} <= set(r['metrics'])
            assert osp.isfile(r['predictions'])
        else:  # the real IoUMetric, plus each class's IoU
            assert {'mIoU', 'aAcc', 'IoU.background', 'IoU.circle', 'IoU.square',
                    'IoU.triangle'} <= set(r['metrics'])
            assert osp.isdir(r['predictions'])
        drawing = cv2.imread(r['drawing'])
        # two images, upscaled SCALE times, each ground truth beside prediction
        side = quickstart.SCALE * summary_img_size(tmp_path)
        assert drawing.shape[0] > side and drawing.shape[1] > 2 * 2 * side
        # the softmax counterpart really has 'S' stages, the Pola model 'L' stages
        keys = _state_dict(r['checkpoint']).keys()
        attn = 'backbone.layers.0.blocks.0.attn.'
        if variant == 'softmax':
            assert attn + 'q.weight' in keys and attn + 'power' not in keys
        else:
            assert attn + 'qg.weight' in keys and attn + 'power' in keys
    with open(work_dir / 'summary.json') as f:
        summary = json.load(f)
    assert set(summary['results']) == {'det/pola', 'det/softmax', 'seg/pola', 'seg/softmax'}
    assert summary['data']['args']['num_train'] == 4
    assert summary['data_seconds'] >= 0 and summary['total_seconds'] > 0
    for text in ('Pola (LLLL)', 'softmax (SSSS)', 'bbox mAP', 'IoU triangle', 'train time (s)',
                 'peak RSS (MiB)', 'predictions.png', 'stages (jobs side by side): data ',
                 'Mask R-CNN (softmax): train ', 'Semantic FPN (pola): train '):
        assert text in out, out[-3000:]
    # a few iterations on 4 images learn nothing: the check says so, naming the metric
    assert 'Mask R-CNN: BELOW the floors: bbox mAP ' in out, out[-3000:]
    assert 'Semantic FPN: BELOW the floors: mIoU ' in out, out[-3000:]


def test_check_floors():
    good = dict(metrics={'coco/bbox_mAP': 0.45, 'coco/bbox_mAP_50': 0.7})
    seg = dict(metrics={'mIoU': 72.0, 'IoU.circle': 70.0, 'IoU.square': 49.5, 'IoU.triangle': 60})
    lines = quickstart.check_floors({('det', 'pola'): good, ('seg', 'pola'): seg})
    assert lines[0].startswith('Mask R-CNN: floors met (bbox mAP >= 0.300, bbox mAP@50 >= 0.600')
    assert lines[1] == ('Semantic FPN: BELOW the floors: IoU square 49.50 < 50.00 '
                        '(see docs/get_started.md, "Quickstart")')


def test_format_table_one_variant():
    r = dict(metrics={'mIoU': 71.234, 'IoU.square': 60.0}, train_seconds=12.3, peak_rss_mib=900)
    table = quickstart.format_table({('seg', 'pola'): r}, compare=False)
    assert 'softmax' not in table
    assert '71.23' in table and '60.00' in table and '12.3' in table and '900' in table
    assert 'IoU circle' in table and 'Mask R-CNN' not in table


def test_fused_optimizer_where_the_torch_has_one():
    from polaformer_mm.engine import entry
    from polaformer_mm.utils.compat import has_fused_adamw
    for task in ('det', 'seg'):
        cfg = entry.load_config(osp.join(quickstart.REPO, quickstart.TASKS[task]['config']))
        assert cfg.optim_wrapper.optimizer.foreach is True  # what older torch keeps
        quickstart._fused_optimizer(cfg)
        optimizer = cfg.optim_wrapper.optimizer
        fused = has_fused_adamw('cuda' if torch.cuda.is_available() else 'cpu')
        assert optimizer.get('fused', False) is fused
        assert optimizer.get('foreach') is (None if fused else True)
        # and AdamW takes the options as they are left
        params = [torch.zeros(2, requires_grad=True)]
        options = {k: v for k, v in optimizer.items() if k not in ('type', 'lr')}
        torch.optim.AdamW(params, lr=optimizer.lr, **options)
