"""The files of a warm start as a user meets them through the real tools: the ImageNet
``_ft`` configs train from what ``softmax2pola.py --config`` writes, a file with NaN or
infinite weights is refused by ``WarmStart``, ``Pretrained`` and the converter (naming
the file and the first bad keys), and the errors' advice works when followed."""
import math
import os
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook

from polaformer_mm.models import PolaPVTv2
from polaformer_mm.models.official_weights import NonFiniteWeightsError
from tests import REPO
from tests._tools import load_tool
from .._smoke import classification_root, smoke_classification_config
from ..test_models._softmax_files import PVTV2_POLA, mmdet_pvtv2, mmpretrain_deit, save

TOOL = 'model_converters/softmax2pola.py'
pytest.importorskip('mmdet')
pytest.importorskip('mmpretrain')


def _poison(path, key_index=3, value=float('nan')):
    """The file at ``path`` with one value of its ``key_index``-th tensor replaced;
    returns that tensor's key."""
    obj = torch.load(path, weights_only=True)
    key = list(obj['state_dict'])[key_index]
    obj['state_dict'][key] = obj['state_dict'][key].clone()
    obj['state_dict'][key].view(-1)[0] = value
    torch.save(obj, path)
    return key


@pytest.fixture
def pvtv2_file(tmp_path):
    """An mmdet PyramidVisionTransformerV2 file (whole-model keys, 'backbone.')."""
    return save(tmp_path / 'pvtv2_softmax.pth', mmdet_pvtv2().state_dict(), 'backbone.')


def _pvtv2(init_cfg):
    torch.manual_seed(0)
    return PolaPVTv2(**PVTV2_POLA, attn_types='LLLL', init_cfg=init_cfg)


# ---------------------------------------------------------------- NaN / inf (case 5)


@pytest.mark.parametrize('value', [float('nan'), float('inf')])
def test_warm_start_refuses_non_finite_weights(pvtv2_file, value):
    key = _poison(pvtv2_file, value=value)
    model = _pvtv2(dict(type='WarmStart', checkpoint=pvtv2_file))
    with pytest.raises(NonFiniteWeightsError) as err:
        model.init_weights()
    assert repr(pvtv2_file) in str(err.value) and key in str(err.value)
    assert 'not finite' in str(err.value) and '1 of the' in str(err.value)


def test_pretrained_refuses_non_finite_weights(pvtv2_file, tmp_path):
    dst = tmp_path / 'pola.pth'
    load_tool(TOOL).main([pvtv2_file, str(dst), '--config', _pvtv2_config(tmp_path)])
    # the intact file loads, the poisoned one is refused naming the file and the key
    _pvtv2(dict(type='Pretrained', checkpoint=str(dst), prefix='backbone.')).init_weights()
    key = _poison(dst, key_index=5, value=float('-inf'))
    with pytest.raises(NonFiniteWeightsError) as err:
        _pvtv2(dict(type='Pretrained', checkpoint=str(dst), prefix='backbone.')).init_weights()
    assert repr(str(dst)) in str(err.value) and key in str(err.value)


def _pvtv2_config(tmp_path):
    config = tmp_path / 'pola_pvtv2.py'
    config.write_text(f'model = dict(backbone=dict(type="PolaPVTv2", **{PVTV2_POLA!r}, '
                      "attn_types='LLLL'))\n")
    return str(config)


def test_converter_refuses_non_finite_weights(pvtv2_file, tmp_path, capsys):
    key = _poison(pvtv2_file)
    dst = tmp_path / 'out.pth'
    with pytest.raises(SystemExit) as exit_info:
        load_tool(TOOL).main([pvtv2_file, str(dst), '--config', _pvtv2_config(tmp_path)])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith('softmax2pola: error: ') and pvtv2_file in err and key in err
    assert not dst.exists()


# ------------------------------------------------------ advice that works (case 7)


def test_softmax_file_given_to_pretrained_points_to_warm_start(pvtv2_file):
    with pytest.raises(KeyError) as err:
        _pvtv2(dict(type='Pretrained', checkpoint=pvtv2_file)).init_weights()
    message = err.value.args[0]
    assert "init_cfg=dict(type='WarmStart', checkpoint=...)" in message
    assert 'Check arch and attn_types' not in message
    # following the advice: the same file, the same backbone, type='WarmStart'
    model = _pvtv2(dict(type='WarmStart', checkpoint=pvtv2_file))
    model.init_weights()
    assert model.warm_start_report.loaded


def test_other_mismatches_still_say_check_arch(tmp_path):
    wide = PolaPVTv2(arch='b0', attn_types='LLLL')
    path = save(tmp_path / 'b0.pth', wide.state_dict(), 'backbone.')
    with pytest.raises(ValueError, match='Check arch'):
        _pvtv2(dict(type='Pretrained', checkpoint=path)).init_weights()


def test_whole_model_file_without_prefix_loads(pvtv2_file, tmp_path):
    """A whole-model file whose keys carry no 'backbone.' prefix (neck.*, head.* beside
    the backbone's): the backbone's keys load, the others are reported unused."""
    obj = torch.load(pvtv2_file, weights_only=True)
    bare = {k[len('backbone.'):]: v for k, v in obj['state_dict'].items()}
    bare.update({'neck.lateral.weight': torch.ones(4, 4), 'head.fc.weight': torch.ones(10, 64)})
    path = save(tmp_path / 'whole_bare.pth', bare)
    model = _pvtv2(dict(type='WarmStart', checkpoint=path))
    model.init_weights()
    assert 'neck.lateral.weight' in model.warm_start_report.unused
    assert 'a module the backbone has none of (neck)' in model.warm_start_report.unused[
        'neck.lateral.weight']
    reference = _pvtv2(dict(type='WarmStart', checkpoint=pvtv2_file))
    reference.init_weights()
    for key, value in reference.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key
    # the same through Pretrained: a converted file with its prefix dropped, plus a head
    dst = tmp_path / 'pola.pth'
    load_tool(TOOL).main([pvtv2_file, str(dst), '--config', _pvtv2_config(tmp_path)])
    converted = torch.load(dst, weights_only=True)['state_dict']
    bare = {k[len('backbone.'):]: v for k, v in converted.items()}
    bare['head.fc.weight'] = torch.ones(10, 64)
    path = save(tmp_path / 'pola_bare.pth', bare)
    model = _pvtv2(dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    for key, value in model.state_dict().items():
        assert torch.equal(value, converted['backbone.' + key]), key


def _unwritable_folder(tmp_path):
    if os.geteuid() != 0:
        folder = tmp_path / 'read_only'
        folder.mkdir()
        folder.chmod(0o555)
        return str(folder)
    for candidate in ('/sys', '/proc'):  # root writes anywhere else
        try:
            open(osp.join(candidate, '.probe_polaformer'), 'wb').close()
        except OSError:
            return candidate
    pytest.skip('no folder this user cannot write')


def test_unwritable_destination_is_named_before_any_work(pvtv2_file, tmp_path, capsys):
    folder = _unwritable_folder(tmp_path)
    dst = osp.join(folder, 'pola.pth')
    with pytest.raises(SystemExit) as exit_info:
        load_tool(TOOL).main([pvtv2_file, dst, '--config', _pvtv2_config(tmp_path)])
    assert exit_info.value.code == 1
    out, err = capsys.readouterr()
    line = err.strip().splitlines()[-1]
    assert line.startswith(f'softmax2pola: error: DST {dst}: cannot write in {folder} (')
    assert '.tmp-' not in err and 'Errno' not in err
    assert 'loaded' not in out  # no warm start was made
    # a file where a folder should be
    blocker = tmp_path / 'blocker'
    blocker.write_text('x')
    with pytest.raises(SystemExit):
        load_tool(TOOL).main(
            [pvtv2_file,
             str(blocker / 'sub' / 'pola.pth'), '--config',
             _pvtv2_config(tmp_path)])
    assert f'{blocker} is a file, not a folder' in capsys.readouterr().err
    # following the advice (a folder that can be written): it works
    load_tool(TOOL).main(
        [pvtv2_file,
         str(tmp_path / 'new' / 'pola.pth'), '--config',
         _pvtv2_config(tmp_path)])
    assert (tmp_path / 'new' / 'pola.pth').exists()


# ---------------------------------------------- the _ft configs train (case 3)


class _Start(Hook):
    """Keeps the backbone's weights as training starts."""

    def before_train(self, runner):
        self.state = {k: v.clone() for k, v in runner.model.backbone.state_dict().items()}


def _softmax_release(kind, tmp_path):
    if kind == 'pvtv2-b0':
        from mmdet.models.backbones import PyramidVisionTransformerV2
        torch.manual_seed(0)
        module = PyramidVisionTransformerV2(
            embed_dims=32, num_layers=[2, 2, 2, 2], num_heads=[1, 2, 5, 8])
        return save(tmp_path / 'pvt_v2_b0.pth', module.state_dict(), 'backbone.')
    deit = mmpretrain_deit(arch='deit-tiny', img_size=224, out_indices=(11, ))
    return save(tmp_path / 'deit_tiny.pth', deit.state_dict(), 'backbone.')


@pytest.mark.slow
@pytest.mark.parametrize('kind,base,ft', [
    ('pvtv2-b0', 'pola-pvtv2-b0_8xb128_in1k.py', 'pola-pvtv2-b0_ft-8xb128-30e_in1k.py'),
    ('deit-tiny', 'pola-deit-tiny_4xb256_in1k.py', 'pola-deit-tiny_ft-4xb256-30e_in1k.py'),
])
def test_ft_config_trains_from_the_converters_file(kind, base, ft, tmp_path):
    """As documented: softmax2pola.py SRC DST --config BASE, then the _ft config trains
    from DST (its backbone starts as DST); a NaN copy of DST stops it at the start,
    naming the file."""
    from polaformer_mm.engine import entry
    src = _softmax_release(kind, tmp_path)
    cfg = entry.load_config(osp.join(REPO, 'configs/imagenet', ft))
    init_cfg = dict(cfg.model.backbone.init_cfg)
    dst = tmp_path / init_cfg['checkpoint']  # the path the config reads, under tmp_path
    load_tool(TOOL).main([src, str(dst), '--config', osp.join(REPO, 'configs/imagenet', base)])
    written = torch.load(dst, weights_only=True)['state_dict']
    assert all(k.startswith('backbone.') for k in written)  # backbone only, as documented

    data_root = classification_root(tmp_path / 'data')
    smoke_classification_config(cfg, data_root, tmp_path / 'work')
    cfg.model.backbone.init_cfg = dict(init_cfg, checkpoint=str(dst))  # the config's loading
    runner = entry.build_runner(cfg)
    start = _Start()
    runner.register_hook(start)
    runner.train()
    assert runner.iter == 1
    assert math.isfinite(runner.message_hub.log_scalars['train/loss'].current())
    for key, value in start.state.items():
        assert torch.equal(value, written['backbone.' + key]), key

    key = _poison(dst)
    cfg.work_dir = str(tmp_path / 'work2')
    with pytest.raises(NonFiniteWeightsError, match=key):
        entry.build_runner(cfg).train()
