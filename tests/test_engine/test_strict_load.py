"""load_from, test checkpoints and --resume: strict by default, with named causes.

A checkpoint that does not fit the model used to load partly or not at all, with only a
log warning; tools/test.py then scored random weights. Now it is an error naming the keys
and the likely cause; ``allow_partial_load=True`` (``--allow-partial``) loads what fits.
Bad files (not a checkpoint, weights only for --resume) get messages that say so.
"""
import os.path as osp
import re
import traceback

import pytest
import torch
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope

from polaformer_mm.engine import CheckpointMismatchError, entry
from polaformer_mm.utils.checkpoint_io import CheckpointError
from tests import REPO
from .._smoke import smoke_config
from .._tools import load_tool
from ..test_models._golden import load_golden
from ..test_models._official_files import save_official

DET = osp.join(REPO, 'configs/quickstart/mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
SEG = osp.join(REPO, 'configs/quickstart/fpn_pola-pvt-nano_synthetic-seg.py')


def _cfg(path, data_root, work_dir, **opts):
    cfg = entry.load_config(path)
    smoke_config(cfg, data_root, work_dir)
    cfg.merge_from_dict(opts)
    return cfg


@pytest.fixture(scope='module')
def det_runner(synthetic_data_root, tmp_path_factory):
    return entry.build_runner(_cfg(DET, synthetic_data_root, tmp_path_factory.mktemp('det')))


@pytest.fixture(scope='module')
def files(det_runner, synthetic_data_root, golden_dir, tmp_path_factory):
    """Checkpoints of other models, written as their own tools write them."""
    import torchvision
    from mmseg.registry import MODELS
    out = tmp_path_factory.mktemp('ckpts')
    paths = {
        k: str(out / f'{k}.pth')
        for k in ('resnet18', 'segmentor', 'backbone', 'bare_backbone', 'official', 'classes5')
    }
    torch.save(torchvision.models.resnet18().state_dict(), paths['resnet18'])
    init_default_scope('mmseg')
    segmentor = MODELS.build(entry.load_config(SEG).model)
    init_default_scope('mmdet')
    torch.save({'state_dict': segmentor.state_dict(), 'meta': {}}, paths['segmentor'])
    own = det_runner.model.state_dict()
    backbone = {k: v for k, v in own.items() if k.startswith('backbone.')}
    torch.save({'state_dict': backbone}, paths['backbone'])
    torch.save({k[len('backbone.'):]: v for k, v in backbone.items()}, paths['bare_backbone'])
    save_official(paths['official'],
                  load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')['state_dict'])
    classes5 = dict(own)  # the same detector trained for 5 classes instead of 3
    for key in [k for k in own if 'fc_cls' in k or 'fc_reg' in k or 'conv_logits' in k]:
        per_class = {'fc_cls': 1, 'fc_reg': 4, 'conv_logits': 1}[key.split('.')[-2]]
        extra = 2 * per_class
        classes5[key] = torch.cat([own[key], own[key][:extra]])
    torch.save({'state_dict': classes5}, paths['classes5'])
    return paths


@pytest.mark.parametrize('kind,cause,named', [
    ('resnet18', r'no key matches: a checkpoint of another architecture', 'layer1.0.conv1'),
    ('segmentor', r'a segmentation checkpoint \(decode_head\) for a detection model',
     'decode_head'),
    ('backbone', r'a backbone-only file .*init_cfg', 'rpn_head'),
    ('bare_backbone', r'a backbone-only file \(keys without the backbone\. prefix\)',
     'patch_embed'),
    ('official', r'an official PolaFormer .*official2mm\.py', 'model, optimizer'),
    ('classes5', r'other head sizes \(another number of classes\?\)',
     r'fc_cls\.weight: checkpoint \[6, 256\] vs model \[4, 256\]'),
])
def test_checkpoint_that_does_not_fit_is_an_error(det_runner, files, kind, cause, named):
    before = {k: v.clone() for k, v in det_runner.model.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as info:
        det_runner.load_checkpoint(files[kind])
    message = str(info.value)
    assert files[kind] in message
    assert re.search(cause, message), message
    assert re.search(named, message), message
    assert '--allow-partial' in message and 'allow_partial_load' in message
    after = det_runner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing was loaded


def test_test_tool_is_strict_and_allow_partial_opts_out(files, synthetic_data_root, tmp_path):
    cfg = _cfg(DET, synthetic_data_root, tmp_path / 'strict')
    entry.prepare_test_config(cfg, DET, files['backbone'], work_dir=str(tmp_path / 'strict'))
    with pytest.raises(CheckpointMismatchError, match='backbone-only'):
        entry.build_runner(cfg).test()

    cfg = _cfg(DET, synthetic_data_root, tmp_path / 'partial')
    entry.prepare_test_config(
        cfg, DET, files['backbone'], work_dir=str(tmp_path / 'partial'), allow_partial=True)
    assert cfg.allow_partial_load is True
    runner = entry.build_runner(cfg)
    metrics = runner.test()
    assert metrics is not None
    loaded = torch.load(files['backbone'], weights_only=True)['state_dict']
    own = runner.model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in loaded.items())
    log = open(MMLogger.get_current_instance().log_file).read()
    assert 'Loading only what fits (partial loading is allowed)' in log


def _tool(name):
    return load_tool(f'{name}.py', f'tool_{name}')


def test_tools_have_the_allow_partial_flag():
    assert _tool('test').parse_args(['c.py', 'x.pth', '--allow-partial']).allow_partial
    assert not _tool('test').parse_args(['c.py', 'x.pth']).allow_partial
    assert _tool('train').parse_args(['c.py', '--allow-partial']).allow_partial


def test_checkpoints_the_runner_writes_load_strictly(synthetic_data_root, tmp_path):
    """A checkpoint written by the runner loads strictly into a new runner of the same
    config (mmseg here; mmdet through test_tools_cli and the resume tests)."""
    writer = entry.build_runner(_cfg(SEG, synthetic_data_root, tmp_path / 'a'))
    writer.save_checkpoint(
        str(tmp_path / 'a'), 'iter_1.pth', save_optimizer=False, save_param_scheduler=False)
    reader = entry.build_runner(_cfg(SEG, synthetic_data_root, tmp_path / 'b'))
    reader.load_checkpoint(str(tmp_path / 'a' / 'iter_1.pth'))
    a, b = writer.model.state_dict(), reader.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_from_a_weights_only_file_says_use_load_from(det_runner, synthetic_data_root,
                                                            tmp_path):
    weights = tmp_path / 'converted.pth'
    torch.save({
        'state_dict': det_runner.model.state_dict(),
        'meta': {
            'note': 'published'
        }
    }, weights)
    cfg = _cfg(DET, synthetic_data_root, tmp_path)
    entry.prepare_train_config(cfg, DET, work_dir=str(tmp_path), resume=str(weights))
    with pytest.raises(CheckpointError) as info:
        entry.build_runner(cfg).train()
    message = str(info.value)
    assert 'not a checkpoint of a training run' in message
    assert f'--cfg-options load_from={weights}' in message
    assert "meta['epoch']" in message and 'message_hub' in message


@pytest.mark.parametrize('content,expected', [
    (b'', 'is an empty file'),
    (bytes(range(7, 256)) * 20, 'is not a checkpoint'),
    ('half', 'is not a complete checkpoint'),
])
def test_bad_checkpoint_file_is_named_without_unsafe_hint(det_runner, tmp_path, content, expected):
    path = tmp_path / 'bad.pth'
    if content == 'half':
        torch.save({'state_dict': det_runner.model.state_dict()}, path)
        data = path.read_bytes()
        content = data[:len(data) // 2]
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        det_runner.load_checkpoint(str(path))
    assert str(path) in str(info.value) and expected in str(info.value)
    shown = ''.join(traceback.format_exception(info.value))
    assert 'weights_only' not in shown
