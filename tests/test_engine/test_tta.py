"""tools/test.py --tta (entry.enable_tta) and the metrics file tools/test.py writes.

Segmentation --tta runs end to end in tests/test_tools/test_reproduce.py; here a RetinaNet
config trains one iteration and is tested with and without --tta through tools/test.py.
"""
import json
import os.path as osp
import pickle

import pytest

from polaformer_mm.analysis.gain_table import make_gain_table
from polaformer_mm.engine import entry
from tests import REPO
from .._smoke import smoke_cfg_options, smoke_config
from .._tools import load_tool

MASK_RCNN = osp.join(REPO, 'configs/pola_pvt/mask-rcnn_pola-pvt-t_fpn_1x_coco.py')
SEG = osp.join(REPO, 'configs/pola_pvt/fpn_pola-pvt-t_8xb2-40k_ade20k-512x512.py')
RETINANET = osp.join(REPO, 'configs/pola_pvt/retinanet_pola-pvt-t_fpn_1x_coco.py')
CLS = osp.join(REPO, 'configs/imagenet/pola-pvt-tiny_8xb128_in1k.py')


@pytest.mark.slow
def test_detection_tta_through_test_tool(synthetic_data_root, tmp_path):
    run_dir = tmp_path / 'run'
    cfg = smoke_config(entry.load_config(RETINANET), synthetic_data_root, run_dir)
    cfg.default_hooks.checkpoint.update(interval=1, save_last=True)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    entry.build_runner(cfg).train()
    ckpt = run_dir / 'epoch_1.pth'
    assert ckpt.is_file()

    # the test tool with the same test-size override, as a user passes it; after one
    # iteration RetinaNet scores nothing above its 0.05 threshold (focal-loss prior 0.01)
    options = smoke_cfg_options(RETINANET, synthetic_data_root) + ['model.test_cfg.score_thr=0.0']
    test = load_tool('test.py', 'test_tool_under_test')
    results = {}
    for sub, extra in (('test', []), ('test_tta', ['--tta'])):
        out = tmp_path / f'{sub}.pkl'
        metrics = test.main([
            RETINANET,
            str(ckpt), '--work-dir',
            str(run_dir / sub), '--out',
            str(out), *extra, '--cfg-options', *options
        ])
        record = _json(run_dir / sub)
        assert record['metrics'] == pytest.approx(metrics)
        assert 'coco/bbox_mAP' in metrics and 'coco/bbox_mAP_75' in metrics
        assert record['tta'] is bool(extra)
        assert record['checkpoint'] == str(ckpt)
        assert record['config'] == RETINANET
        with open(out, 'rb') as f:
            results[sub] = pickle.load(f)[0]['pred_instances']
    # the flip views were merged by DetTTAModel (NMS 0.5), unlike the single-scale boxes
    assert len(results['test_tta']['bboxes']) > 0
    assert len(results['test_tta']['bboxes']) != len(results['test']['bboxes']) or \
        not (results['test_tta']['bboxes'] == results['test']['bboxes']).all()
    dumped = (run_dir / 'test_tta' / osp.basename(RETINANET)).read_text()
    assert "type='DetTTAModel'" in dumped and "'flip_direction'" in dumped

    # the detection columns of the gain table: single-scale COCO AP x 100, no AP^m
    rows = make_gain_table([str(run_dir)], out=str(tmp_path / 'table'), flops=False)
    single = _json(run_dir / 'test')['metrics']
    assert [(r['backbone'], r['row'], r['schedule'])
            for r in rows] == [('Pola-PVT-T', 'pola', '1 ep')]
    assert list(rows[0]['columns']) == ['AP_b', 'AP_b_50', 'AP_b_75']
    for col, key in (('AP_b', 'bbox_mAP'), ('AP_b_50', 'bbox_mAP_50'), ('AP_b_75', 'bbox_mAP_75')):
        assert rows[0][col] == pytest.approx(100 * single[f'coco/{key}'])
    assert rows[0]['flops_G'] is None and 12 < rows[0]['params_M'] < 13
    assert not osp.exists(tmp_path / 'table.png')  # no pair, no chart
    with pytest.raises(FileNotFoundError, match='test_metrics.json'):
        make_gain_table([str(synthetic_data_root)])  # no test results in there


def _json(work_dir):
    with open(work_dir / 'test_metrics.json') as f:
        return json.load(f)


def test_enable_tta_segmentation_uses_the_config(tmp_path):
    cfg = entry.load_config(SEG)
    assert cfg.tta_model.type == 'SegTTAModel'  # from mmseg's default_runtime.py
    entry.prepare_test_config(cfg, SEG, _ckpt(tmp_path), tta=True)
    assert cfg.model.type == 'SegTTAModel' and cfg.model.module.backbone.type == 'PolaPVT'
    aug = cfg.test_dataloader.dataset.pipeline[1]
    assert aug.type == 'TestTimeAug'
    assert [t['scale_factor'] for t in aug.transforms[0]] == [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    assert [t['prob'] for t in aug.transforms[1]] == [0., 1.]

    cfg = entry.load_config(SEG)
    cfg.pop('tta_model')
    with pytest.raises(KeyError, match='tta_model'):
        entry.prepare_test_config(cfg, SEG, _ckpt(tmp_path), tta=True)


def test_enable_tta_detection_default_and_errors(tmp_path):
    cfg = entry.load_config(RETINANET)
    assert 'tta_model' not in cfg and 'tta_pipeline' not in cfg  # mmdet's bases define none
    entry.prepare_test_config(cfg, RETINANET, _ckpt(tmp_path), tta=True)
    assert cfg.model.type == 'DetTTAModel' and cfg.model.module.type == 'RetinaNet'
    assert cfg.model.tta_cfg == dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100)
    aug = cfg.test_dataloader.dataset.pipeline[-1]
    assert aug.type == 'TestTimeAug' and [t['prob'] for t in aug.transforms[0]] == [1., 0.]
    assert aug.transforms[1][0]['meta_keys'][-2:] == ('flip', 'flip_direction')

    cfg = entry.load_config(MASK_RCNN)  # DetTTAModel asserts that there are no masks
    with pytest.raises(ValueError, match='mask head'):
        entry.prepare_test_config(cfg, MASK_RCNN, _ckpt(tmp_path), tta=True)

    cfg = entry.load_config(RETINANET)
    cfg.test_dataloader.dataset.pipeline = cfg.test_dataloader.dataset.pipeline[:-1]
    with pytest.raises(ValueError, match='PackDetInputs'):
        entry.prepare_test_config(cfg, RETINANET, _ckpt(tmp_path), tta=True)

    cfg = entry.load_config(CLS)
    with pytest.raises(ValueError, match='detection .* and segmentation'):
        entry.prepare_test_config(cfg, CLS, _ckpt(tmp_path), tta=True)


def _ckpt(tmp_path):
    path = tmp_path / 'weights.pth'
    path.write_bytes(b'')  # prepare_test_config only checks that the file is there
    return str(path)
