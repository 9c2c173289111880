"""The panoptic Mask2Former configs: the dataset check on COCO-panoptic data that mmdet
loads, and the named panopticapi error of tools/train.py, tools/test.py and the demo."""
import json
import os.path as osp
import subprocess
import sys

import pytest

from polaformer_mm.engine import entry
from polaformer_mm.engine.dataset_check import check_datasets, format_reports
from polaformer_mm.engine.panoptic_api import (PANOPTICAPI_INSTALL, PanopticApiMissingError,
                                               panopticapi_available, panopticapi_keys)
from tests import REPO
from .._tools import load_tool

PANOPTIC = osp.join(
    REPO, 'configs/pola_swin/mask2former_pola-swin-t-p4-w7-224_8xb2-lsj-50e_coco-panoptic.py')
INSTANCE = osp.join(REPO,
                    'configs/pola_swin/mask2former_pola-swin-t-p4-w7-224_8xb2-lsj-50e_coco.py')
no_panopticapi = pytest.mark.skipif(panopticapi_available(), reason='panopticapi is installed')


@pytest.fixture
def root(tmp_path):
    """Synthetic data with COCO-panoptic annotations, from the generator tool."""
    out = str(tmp_path / 'syn')
    tool = load_tool('dataset_converters/generate_synthetic_data.py')
    assert tool.main([
        '--out', out, '--num-train', '3', '--num-val', '2', '--size', '64', '--workers', '1',
        '--panoptic'
    ]) == 0
    return out + '/'


def _options(root):
    """--cfg-options that point the panoptic config at the synthetic data."""
    gen = load_tool('dataset_converters/generate_synthetic_data.py')
    things, stuff = list(gen.PANOPTIC_THING_CLASSES), list(gen.PANOPTIC_STUFF_CLASSES)
    meta = dict(classes=things + stuff, thing_classes=things, stuff_classes=stuff)
    options = {}
    for split, name in (('train', 'train'), ('val', 'val'), ('test', 'val')):
        ds = f'{split}_dataloader.dataset.'
        options.update({
            ds + 'data_root': root,
            ds + 'ann_file': f'annotations/panoptic_{name}.json',
            ds + 'data_prefix.img': f'images/{name}/',
            ds + 'data_prefix.seg': f'annotations/panoptic_{name}/',
        })
        options.update({ds + 'metainfo.' + k: v for k, v in meta.items()})
    return options


def _argv(options):
    """The options as --cfg-options arguments."""
    return [
        f"{k}=[{','.join(v)}]" if isinstance(v, list) else f'{k}={v}' for k, v in options.items()
    ]


def _edit(root, split, edit):
    path = osp.join(root, f'annotations/panoptic_{split}.json')
    with open(path) as f:
        data = json.load(f)
    edit(data)
    with open(path, 'w') as f:
        json.dump(data, f)
    return data


def _mmdet_dataset(cfg, split='train'):
    """mmdet's own CocoPanopticDataset on the config's data (no pipeline: its
    LoadPanopticAnnotations needs panopticapi)."""
    from mmdet.datasets import CocoPanopticDataset
    ds = cfg[f'{split}_dataloader'].dataset.to_dict()
    ds.pop('type')
    ds.pop('_scope_', None)
    ds['pipeline'] = []
    return CocoPanopticDataset(**ds)


def test_valid_panoptic_data_passes_the_check_and_loads_in_mmdet(root):
    cfg = entry.load_config(PANOPTIC, _options(root))
    dataset = _mmdet_dataset(cfg)
    assert len(dataset) == 3 and dataset[0]['segments_info']
    reports = check_datasets(cfg)
    text = format_reports(reports)
    assert len(reports) == 2 and not any(r.errors for r in reports), text
    assert 'CocoPanopticDataset' in text and 'segments' in text
    tool = load_tool('misc/check_dataset.py')
    assert tool.main([PANOPTIC, '--cfg-options', *_argv(_options(root))]) == 0


@pytest.mark.parametrize('case', ['no_bbox', 'foreign_category', 'no_png'])
def test_broken_panoptic_data_is_named_where_mmdet_fails(root, case):
    """Each error the check names is one mmdet stops with on the same file."""
    if case == 'no_bbox':
        data = _edit(root, 'train', lambda d: d['annotations'][1]['segments_info'][0].pop('bbox'))
        expected, mmdet_error = "segments without 'bbox'", KeyError
    elif case == 'foreign_category':
        data = _edit(root, 'train',
                     lambda d: d['annotations'][1]['segments_info'][0].update(category_id=99))
        expected, mmdet_error = "not among the config's classes", KeyError
    else:
        data = _edit(root, 'train', lambda d: None)
        import os
        os.remove(osp.join(root, 'annotations/panoptic_train', data['annotations'][1]['file_name']))
        expected, mmdet_error = 'without a PNG segment map', None
    name = data['images'][1]['file_name'].replace('.jpg', '.png')
    cfg = entry.load_config(PANOPTIC, _options(root))
    reports = check_datasets(cfg, splits=('train', ))
    errors = '\n'.join(reports[0].errors)
    assert len(reports[0].errors) == 1 and expected in errors, format_reports(reports)
    assert (name if case == 'no_png' else data['images'][1]['file_name']) in errors
    if mmdet_error is not None:
        with pytest.raises(mmdet_error):
            _mmdet_dataset(cfg)


def test_panopticapi_keys_of_the_configs():
    keys = panopticapi_keys(entry.load_config(PANOPTIC), ('train', 'val'))
    text = ' '.join(keys)
    assert 'train_dataloader.dataset.pipeline[1] (LoadPanopticAnnotations' in text
    assert 'val_dataloader.dataset.pipeline[2] (LoadPanopticAnnotations' in text
    assert 'val_evaluator[0] (CocoPanopticMetric' in text
    assert not any(k.startswith('test_') for k in keys)
    assert panopticapi_keys(
        entry.load_config(PANOPTIC), demo=True)[0].startswith('model.test_cfg.panoptic_on=True')
    instance = entry.load_config(INSTANCE)
    assert panopticapi_keys(instance) == [] and panopticapi_keys(instance, demo=True) == []


@no_panopticapi
def test_train_test_and_demo_name_panopticapi_before_any_work(root, tmp_path):
    options = _options(root)
    work_dir = str(tmp_path / 'work')
    train = load_tool('train.py')
    with pytest.raises(PanopticApiMissingError) as info:
        train.main([PANOPTIC, '--work-dir', work_dir, '--cfg-options', *_argv(options)])
    text = str(info.value)
    assert PANOPTICAPI_INSTALL in text and 'train_dataloader.dataset.pipeline[1]' in text
    assert 'val_evaluator[0] (CocoPanopticMetric' in text
    assert not osp.exists(work_dir)  # nothing built, nothing written
    test = load_tool('test.py')
    with pytest.raises(PanopticApiMissingError, match='test_dataloader.dataset.pipeline') as info:
        test.main([PANOPTIC, str(tmp_path / 'any.pth'), '--work-dir', work_dir])
    assert PANOPTICAPI_INSTALL in str(info.value) and 'test_evaluator[0]' in str(info.value)
    demo = load_tool('demo/image_demo.py')
    image = osp.join(root, 'images/val', sorted(__import__('os').listdir(root + 'images/val'))[0])
    with pytest.raises(PanopticApiMissingError, match=r'model\.test_cfg\.panoptic_on') as info:
        demo.main([image, PANOPTIC, '--out-dir', str(tmp_path / 'demo')])
    assert PANOPTICAPI_INSTALL in str(info.value)
    assert not osp.exists(tmp_path / 'demo')


@no_panopticapi
@pytest.mark.slow
def test_the_commands_end_with_the_message_not_a_traceback(tmp_path):
    for tool, extra in (('tools/train.py', []), ('tools/test.py', [str(tmp_path / 'x.pth')])):
        proc = subprocess.run([
            sys.executable,
            osp.join(REPO, tool), PANOPTIC, *extra, '--work-dir',
            str(tmp_path / 'w')
        ],
                              cwd=REPO,
                              capture_output=True,
                              text=True,
                              timeout=300)
        assert proc.returncode != 0
        assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
        assert PANOPTICAPI_INSTALL in proc.stderr and 'LoadPanopticAnnotations' in proc.stderr
