"""Class counts of the model that disagree with the data's classes are named before a run
starts (every wrong key, the data's classes and where they come from), by the runner and
through tools/train.py; the data's classes are found for every dataset type the shipped
configs use (through the registry of the scope that builds it); the settings the error
gives, applied as ``--cfg-options``, make the check pass (and, slow tier, train)."""
import glob
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config

from polaformer_mm.engine import entry
from polaformer_mm.engine.class_check import (ClassMismatchError, check_config_classes,
                                              class_settings, dataset_classes)
from polaformer_mm.engine.model_check import ModelConfigError
from tests import REPO

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
SEG = osp.join(REPO, 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py')
CITYSCAPES = osp.join(REPO, 'configs/pola_pvt/fpn_pola-pvt-t_4xb2-80k_cityscapes-512x1024.py')
CASCADE = osp.join(
    REPO, 'configs/pola_pvt/cascade-mask-rcnn_pola-pvt-s_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py')
M2F_PANOPTIC = osp.join(
    REPO, 'configs/pola_swin/mask2former_pola-swin-t-p4-w7-224_8xb2-lsj-50e_coco-panoptic.py')
M2F_INSTANCE = osp.join(REPO,
                        'configs/pola_swin/mask2former_pola-swin-t-p4-w7-224_8xb2-lsj-50e_coco.py')
M2F_SEG = osp.join(REPO,
                   'configs/pola_swin/mask2former_pola-swin-t_8xb2-90k_cityscapes-512x1024.py')
CLASSIFIER = osp.join(REPO, 'configs/imagenet/pola-pvt-tiny_8xb128_in1k.py')
SHIPPED = sorted(glob.glob(osp.join(REPO, 'configs/**/*.py'), recursive=True))


def _load(path, **options):
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(options)
    return cfg


def _advice(message):
    """The ``key=value`` settings the message says to set, as the tools' ``--cfg-options``
    parser (mmengine's DictAction) reads them."""
    start = message.index(': to train on this data, set ') + len(': to train on this data, set ')
    end = message.index(' (--cfg-options takes these as written)')
    parser = entry.tool_parser('advice')
    entry.add_cfg_options(parser)
    return parser.parse_args(['x.py', '--cfg-options', *message[start:end].split(' ')]).cfg_options


def _follow(cfg, error):
    """Apply the error's advice to ``cfg`` as ``tools/train.py --cfg-options`` does."""
    options = _advice(str(error))
    assert options == error.settings
    cfg.merge_from_dict(options)
    return options


def _runner(config, data_root, work_dir, **options):
    cfg = entry.load_config(config)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = data_root
    cfg.merge_from_dict(options)
    entry.prepare_train_config(cfg, config, work_dir=str(work_dir))
    return entry.build_runner(cfg)


# -- every shipped config, as shipped ---------------------------------------------------
# (dataset type, classes from the config's metainfo): classes, things, stuff
KNOWN = {
    ('CocoDataset', False): (80, None, None),
    ('CocoDataset', True): (3, None, None),  # the quickstart's synthetic shapes
    ('CocoPanopticDataset', False): (133, 80, 53),
    ('ADE20KDataset', False): (150, None, None),
    ('CityscapesDataset', False): (19, None, None),
    ('ImageNet', False): (1000, None, None),
    ('BaseSegDataset', True): (4, None, None),  # the quickstart's background and shapes
}


@pytest.mark.parametrize('config', SHIPPED, ids=[osp.relpath(p, REPO) for p in SHIPPED])
def test_shipped_config_passes_and_its_classes_are_known(config):
    """Resolved through the registry of the dataset's scope (mmdet, mmseg, mmpretrain)."""
    cfg = Config.fromfile(config)
    for split in ('train', 'val', 'test'):
        found = dataset_classes(cfg, split)
        kind = cfg[f'{split}_dataloader'].dataset.type
        assert [(len(d.classes), d.things and len(d.things), d.stuff and len(d.stuff))
                for d in found] == [KNOWN[kind, found[0].from_config]], (split, found)
    counts = [s for s in class_settings(cfg) if s.role != 'weights']
    assert counts and all(s.explicit for s in counts), counts
    check_config_classes(cfg, ('train', 'val', 'test'))


# -- item 1: a 5-class head on Cityscapes ----------------------------------------------
def test_five_class_head_on_cityscapes_is_named_and_the_advice_works():
    cfg = _load(CITYSCAPES, **{'model.decode_head.num_classes': 5})
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg)
    message = str(info.value)
    assert message.startswith(
        'model.decode_head.num_classes=5; but the train data has 19 classes (the METAINFO of '
        "train_dataloader.dataset.type=CityscapesDataset: ('road', 'sidewalk', 'building', "
        "'wall', ...)): to train on this data, set model.decode_head.num_classes=19 "), message
    assert _follow(cfg, info.value) == {'model.decode_head.num_classes': 19}
    check_config_classes(cfg, ('train', 'val', 'test'))


def test_the_other_way_out_naming_five_of_the_classes_works_too():
    cfg = _load(CITYSCAPES, **{'model.decode_head.num_classes': 5})
    with pytest.raises(
            ClassMismatchError,
            match=r'or, for data of 5 classes, name them in '
            r'train_dataloader.dataset.metainfo.classes \(in place of 19\)'):
        check_config_classes(cfg)
    five = ('road', 'sidewalk', 'building', 'car', 'person')
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.metainfo = dict(classes=five)
    check_config_classes(cfg, ('train', 'val', 'test'))


def test_scope_from_the_type_prefix_and_wrappers_looked_into():
    cfg = _load(CITYSCAPES)
    cfg.pop('default_scope')
    inner = cfg.train_dataloader.dataset
    inner.pop('_scope_', None)
    inner.type = 'mmseg.CityscapesDataset'
    cfg.train_dataloader.dataset = dict(
        type='ConcatDataset',
        datasets=[
            dict(type='RepeatDataset', times=2, dataset=inner),
            dict(inner, metainfo=dict(classes=('road', 'car')))
        ])
    found = dataset_classes(cfg, 'train')
    assert [(d.key, len(d.classes))
            for d in found] == [('train_dataloader.dataset.datasets.0.dataset', 19),
                                ('train_dataloader.dataset.datasets.1', 2)]
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg, ('train', ))
    assert 'but the train data has 2 classes (train_dataloader.dataset.datasets.1.metainfo.' \
        "classes=('road', 'car'))" in str(info.value)


# -- item 4: advice that names the real keys of the model -------------------------------
def test_cascade_advice_names_the_per_stage_list_and_the_one_mask_head():
    cfg = _load(CASCADE)
    for i in range(3):
        cfg.model.roi_head.bbox_head[i].num_classes = 5
    cfg.model.roi_head.mask_head.num_classes = 5
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg)
    assert isinstance(cfg.model.roi_head.mask_head, dict)  # one shared mask head
    assert info.value.settings == {
        'model.roi_head.bbox_head.0.num_classes': 80,
        'model.roi_head.bbox_head.1.num_classes': 80,
        'model.roi_head.bbox_head.2.num_classes': 80,
        'model.roi_head.mask_head.num_classes': 80,
    }
    _follow(cfg, info.value)
    assert [h.num_classes for h in cfg.model.roi_head.bbox_head] == [80, 80, 80]
    assert isinstance(cfg.model.roi_head.mask_head, dict)
    check_config_classes(cfg, ('train', 'val', 'test'))


def test_cascade_one_stage_wrong():
    cfg = _load(CASCADE, **{'model.roi_head.bbox_head.1.num_classes': 7})
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg)
    assert str(info.value).startswith('model.roi_head.bbox_head.1.num_classes=7; but the '
                                      'train data has 80 classes')
    assert _follow(cfg, info.value) == {'model.roi_head.bbox_head.1.num_classes': 80}
    check_config_classes(cfg)


def test_mask2former_panoptic_advice_names_things_stuff_fusion_head_and_weights():
    cfg = _load(
        M2F_PANOPTIC, **{
            'model.panoptic_head.num_things_classes': 5,
            'model.panoptic_head.num_stuff_classes': 3,
            'model.panoptic_fusion_head.num_things_classes': 5,
            'model.panoptic_fusion_head.num_stuff_classes': 3,
            'model.panoptic_head.loss_cls.class_weight': [1.0] * 8 + [0.1],
        })
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg)
    message = str(info.value)
    assert 'panoptic_head.num_classes' not in message  # not an argument of the head
    assert '133 classes' in message and '80 things, 53 stuff' in message
    assert _follow(cfg, info.value) == {
        'model.panoptic_head.num_things_classes': 80,
        'model.panoptic_head.num_stuff_classes': 53,
        'model.panoptic_head.loss_cls.class_weight': [1.0] * 133 + [0.1],
        'model.panoptic_fusion_head.num_things_classes': 80,
        'model.panoptic_fusion_head.num_stuff_classes': 53,
    }
    check_config_classes(cfg, ('train', 'val', 'test'))


def test_mask2former_instance_data_is_all_things():
    cfg = _load(M2F_INSTANCE, **{'model.panoptic_head.num_stuff_classes': 53})
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg)
    # its 81 loss weights already fit 80 things and "no object"
    assert _follow(cfg, info.value) == {'model.panoptic_head.num_stuff_classes': 0}
    check_config_classes(cfg)


def test_a_count_changed_without_its_class_weight():
    """mmseg's Mask2Former on data of 5 classes: the head's count fits, its 20 loss weights
    (19 classes and "no object") do not."""
    cfg = _load(M2F_SEG, **{'model.decode_head.num_classes': 5})
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.metainfo = dict(
            classes=('road', 'sidewalk', 'building', 'car', 'person'))
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg)
    assert str(info.value).startswith('model.decode_head.loss_cls.class_weight has 20 values; '
                                      'but the train data has 5 classes')
    assert _follow(cfg, info.value) == {
        'model.decode_head.loss_cls.class_weight': [1.0] * 5 + [0.1]
    }
    check_config_classes(cfg, ('train', 'val', 'test'))


def test_classifier_advice_includes_the_one_hot_labels_of_the_data_preprocessor():
    cfg = _load(CLASSIFIER)
    cfg.model.head.num_classes = 100
    cfg.data_preprocessor.num_classes = 100
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg)
    assert _follow(cfg, info.value) == {
        'model.head.num_classes': 1000,
        'data_preprocessor.num_classes': 1000
    }
    check_config_classes(cfg)


def test_a_count_left_to_the_head_type_default():
    cfg = _load(DET)
    del cfg.model.roi_head.mask_head['num_classes']
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg)
    assert str(info.value).startswith(
        'model.roi_head.mask_head.num_classes=80 (not set: the default of FCNMaskHead); but '
        "the train data has 3 classes (train_dataloader.dataset.metainfo.classes=('circle', "
        "'square', 'triangle'))")
    _follow(cfg, info.value)
    check_config_classes(cfg)


def test_class_weights_of_a_segmentation_loss_keep_their_values():
    cfg = _load(SEG)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.metainfo.classes = ('background', 'circle', 'square')
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg)
    assert _follow(cfg, info.value) == {
        'model.decode_head.num_classes': 3,
        'model.decode_head.loss_decode.class_weight': [0.2, 1.0, 1.0],
    }
    check_config_classes(cfg)


def _loss_on(cfg, num_labels):
    """mmseg's decode loss of ``cfg`` (its class weights) on logits of the head's classes and
    labels 0 .. num_labels - 1, as the decode head computes it in training."""
    import torch
    from mmseg.registry import MODELS
    loss = MODELS.build(cfg.model.decode_head.loss_decode)
    logits = torch.randn(2, cfg.model.decode_head.num_classes, 4, 4)
    labels = torch.arange(32).remainder(num_labels).view(2, 4, 4)
    return loss(logits, labels)


@pytest.mark.parametrize('count, data_classes, advice', [
    (3, 4, {
        'model.decode_head.num_classes': 4
    }),
    (5, 5, {
        'model.decode_head.loss_decode.class_weight': [0.2, 1., 1., 1., 1.]
    }),
])
def test_a_segmentation_count_changed_alone_gets_one_weight_per_class(count, data_classes, advice):
    """A decode head's loss has one class weight per class (no "no object" entry): with
    num_classes changed alone, the advice gives the data's count and one weight per class,
    and the loss followed as written computes (the wrong length is mmseg's 'weight tensor
    should be defined either for all or no classes')."""
    cfg = _load(SEG, **{'model.decode_head.num_classes': count})
    names = ('background', 'circle', 'square', 'triangle', 'star')[:data_classes]
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.metainfo.classes = names
    with pytest.raises(ClassMismatchError) as info:
        check_config_classes(cfg)
    assert _follow(cfg, info.value) == advice
    check_config_classes(cfg, ('train', 'val', 'test'))
    assert _loss_on(cfg, data_classes).isfinite().all()


def test_a_class_count_that_is_no_number_is_named_before_the_model_is_built(
        synthetic_data_root, tmp_path):
    """``--cfg-options model.decode_head.num_classes=four`` (a str, as the tools' parser
    reads it): the runner names the key and value before building the model, and its
    advice followed passes the check."""
    parser = entry.tool_parser('t')
    entry.add_cfg_options(parser)
    options = parser.parse_args(['x.py', '--cfg-options',
                                 'model.decode_head.num_classes=four']).cfg_options
    with pytest.raises(ClassMismatchError) as info:
        _runner(SEG, synthetic_data_root, tmp_path, **options)
    assert str(info.value).startswith(
        "model.decode_head.num_classes='four': a class count is a whole number; the data of "
        'train_dataloader.dataset has 4 classes'), str(info.value)
    cfg = _load(SEG, **options)
    _follow(cfg, info.value)
    check_config_classes(cfg, ('train', 'val', 'test'))


def test_a_segmentation_dataset_without_classes_is_checked_against_its_maps(
        synthetic_data_root, tmp_path):
    """A BaseSegDataset without metainfo names no classes: its maps' largest label (3: the
    synthetic shapes) is compared with num_classes=3 (training would stop with 'Target 3 is
    out of bounds'); the advice followed passes, as does naming the classes."""
    options = {
        'train_dataloader.dataset.metainfo': None,
        'model.decode_head.num_classes': 3,
        'model.decode_head.loss_decode.class_weight': [0.2, 1., 1.]
    }
    runner = _runner(SEG, synthetic_data_root, tmp_path / 'a', **options)
    with pytest.raises(ClassMismatchError) as info:
        runner.train()
    message = str(info.value)
    assert message.startswith(
        'model.decode_head.num_classes=3; model.decode_head.loss_decode.class_weight has 3 '
        'values; but the maps of the train data (train_dataloader.dataset: BaseSegDataset, '
        'which names no classes) hold labels up to 3 ('), message
    assert message.endswith('or name its classes, one per label, in '
                            'train_dataloader.dataset.metainfo.classes')
    cfg = runner.cfg
    assert _follow(cfg, info.value) == {
        'model.decode_head.num_classes': 4,
        'model.decode_head.loss_decode.class_weight': [0.2, 1., 1., 1.]
    }
    check_config_classes(cfg, ('train', 'val', 'test'))
    # the other way out: its classes named, then compared as any others
    cfg = _load(SEG, **options)
    cfg.train_dataloader.dataset.metainfo = dict(classes=('a', 'b', 'c', 'd'))
    with pytest.raises(ClassMismatchError, match='but the train data has 4 classes'):
        check_config_classes(cfg)


# -- through the runner and tools/train.py ----------------------------------------------
def test_detector_heads_with_fewer_classes_than_the_data(synthetic_data_root, tmp_path):
    runner = _runner(DET, synthetic_data_root, tmp_path,
                     **{'model.roi_head.bbox_head.num_classes': 2})
    with pytest.raises(ModelConfigError) as info:
        runner.train()
    assert str(info.value) == (
        'model.roi_head.bbox_head.num_classes=2; but the train data has 3 classes '
        "(train_dataloader.dataset.metainfo.classes=('circle', 'square', 'triangle')): to "
        'train on this data, set model.roi_head.bbox_head.num_classes=3 (--cfg-options takes '
        'these as written)')


def test_segmentor_with_more_classes_than_the_data_when_testing(synthetic_data_root, tmp_path):
    runner = _runner(SEG, synthetic_data_root, tmp_path, **{'model.decode_head.num_classes': 6})
    with pytest.raises(
            ModelConfigError,
            match=r'model.decode_head.num_classes=6; but the test '
            r'data has 4 classes \(test_dataloader.dataset.metainfo.classes='):
        runner.test()


def _train(config, options, cwd):
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/train.py'), config, '--work-dir', 'wd', '--cfg-options', *options
    ],
                          cwd=str(cwd),
                          capture_output=True,
                          text=True,
                          timeout=900)


def _named_error(proc):
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('train.py: error: '), last
    return last[len('train.py: error: '):]


@pytest.mark.slow
def test_train_py_stops_a_five_class_head_on_cityscapes(synthetic_data_root, tmp_path):
    from tests._smoke import smoke_cfg_options
    options = smoke_cfg_options(CITYSCAPES, synthetic_data_root)
    message = _named_error(
        _train(CITYSCAPES, options + ['model.decode_head.num_classes=5'], tmp_path))
    assert message.startswith('model.decode_head.num_classes=5; but the train data has 19 '
                              'classes (the METAINFO of train_dataloader.dataset.type='
                              'CityscapesDataset'), message
    assert not osp.exists(osp.join(str(tmp_path), 'wd', 'iter_1.pth'))


@pytest.mark.slow
@pytest.mark.parametrize(
    'config, wrong, fixed', [(CASCADE, [
        'model.roi_head.mask_head.num_classes=5', 'model.roi_head.bbox_head.2.num_classes=5'
    ], ['model.roi_head.mask_head.num_classes=3', 'model.roi_head.bbox_head.2.num_classes=3']),
                             (M2F_INSTANCE, [
                                 'model.panoptic_head.num_things_classes=5',
                                 'model.panoptic_fusion_head.num_stuff_classes=4'
                             ], [
                                 'model.panoptic_head.num_things_classes=3',
                                 'model.panoptic_fusion_head.num_stuff_classes=0'
                             ])],
    ids=['cascade', 'mask2former'])
def test_train_py_advice_followed_trains(config, wrong, fixed, synthetic_data_root, tmp_path):
    """The config at the synthetic data's scale (its heads with the data's 3 classes); a
    wrong setting is named, and the settings of the message, added to the command, train one
    iteration."""
    from tests._smoke import smoke_config
    small = smoke_config(Config.fromfile(config), synthetic_data_root, 'unused')
    loop = small.train_cfg
    loop['max_iters' if loop.get('type') == 'IterBasedTrainLoop' else 'max_epochs'] = 1
    loop.val_begin = 2
    small.default_hooks.checkpoint.interval = 1
    for key in ('work_dir', 'launcher', 'runner_type'):
        small.pop(key, None)
    config = str(tmp_path / osp.basename(config))
    small.dump(config)
    options = wrong
    message = _named_error(_train(config, options, tmp_path / 'wrong'))
    advice = _advice_strings(message)
    assert sorted(advice) == sorted(fixed), message
    proc = _train(config, options + advice, tmp_path / 'followed')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert osp.exists(osp.join(str(tmp_path), 'followed', 'wd', 'iter_1.pth')) or glob.glob(
        osp.join(str(tmp_path), 'followed', 'wd', 'epoch_1.pth'))


def _advice_strings(message):
    start = message.index(': to train on this data, set ') + len(': to train on this data, set ')
    return message[start:message.index(' (--cfg-options takes these as written)')].split(' ')


@pytest.mark.slow
def test_train_py_seg_data_without_classes_advice_followed_trains(synthetic_data_root, tmp_path):
    """tools/train.py on a segmentation training set that names no classes, with a head of 3
    classes for maps of 4 labels: one line naming the maps' labels, before any iteration;
    its settings added to the command train."""
    from tests._smoke import smoke_config
    small = smoke_config(Config.fromfile(SEG), synthetic_data_root, 'unused')
    small.train_cfg.max_iters = 1
    small.train_cfg.val_interval = 2
    small.default_hooks.checkpoint.interval = 1
    small.train_dataloader.dataset.metainfo = None
    for key in ('work_dir', 'launcher', 'runner_type'):
        small.pop(key, None)
    config = str(tmp_path / 'seg.py')
    small.dump(config)
    wrong = [
        'model.decode_head.num_classes=3', 'model.decode_head.loss_decode.class_weight=[1,1,1]'
    ]
    message = _named_error(_train(config, wrong, tmp_path / 'wrong'))
    assert 'hold labels up to 3' in message, message
    assert not glob.glob(osp.join(str(tmp_path), 'wrong', 'wd', 'iter_*.pth'))
    advice = _advice_strings(message)
    assert advice == [
        'model.decode_head.num_classes=4', 'model.decode_head.loss_decode.class_weight=[1,1,1,1]'
    ], message
    proc = _train(config, wrong + advice, tmp_path / 'followed')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert osp.exists(osp.join(str(tmp_path), 'followed', 'wd', 'iter_1.pth'))
