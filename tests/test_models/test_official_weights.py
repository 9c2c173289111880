import importlib.util
import os

import pytest
import torch

from polaformer_mm import PolaPVT, PolaSwin
from polaformer_mm.models.official_weights import convert_official_checkpoint
from polaformer_mm.models.utils import nlc_to_nchw
from polaformer_mm.utils.checkpoint_io import load_checkpoint
from ._golden import backbone_cfg, load_golden
from ._official_files import save_official


def _backbone(data, **kwargs):
    cfg = backbone_cfg(data['kind'], data['arch'])
    cls = PolaPVT if cfg.pop('type') == 'PolaPVT' else PolaSwin
    return cls(**cfg, **kwargs).eval()


def _raw_stages(backbone, x):
    with torch.no_grad():
        return [nlc_to_nchw(t, hw) for t, hw in backbone.forward_stages(x)]


def test_yacs_is_not_installed():
    # the converter tests below only prove something if yacs is really absent
    assert importlib.util.find_spec('yacs') is None


@pytest.mark.parametrize('name', ['pola_pvt_micro_LLSS_sr8421.pt', 'pola_swin_micro_LLSS.pt'])
def test_convert_yacs_carrying_file(golden_dir, tmp_path, name):
    data = load_golden(golden_dir, name)
    src = save_official(tmp_path / 'official.pth', data['state_dict'])
    with pytest.raises(Exception):  # a plain weights-only load refuses the config
        torch.load(src, weights_only=True)
    dst = tmp_path / 'converted.pth'
    converted = convert_official_checkpoint(str(src), str(dst))
    loaded = torch.load(dst, weights_only=True)
    assert set(loaded) == {'state_dict', 'meta'}
    assert loaded['state_dict'].keys() == converted.keys()
    assert all(k.startswith(('backbone.', 'head.fc.')) for k in converted)
    assert not any('relative_position_index' in k or 'attn_mask' in k for k in converted)


def test_official_file_config_is_kept_as_plain_data(golden_dir, tmp_path):
    data = load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')
    obj = load_checkpoint(save_official(tmp_path / 'o.pth', data['state_dict']))
    assert obj['config']['MODEL']['TYPE'] == 'pola_pvt'
    assert obj['epoch'] == 299


def test_refuses_arbitrary_objects(tmp_path):

    class Payload:

        def __reduce__(self):
            return (os.getcwd, ())

    path = tmp_path / 'evil.pth'
    torch.save({'model': {'w': torch.zeros(1)}, 'x': Payload()}, path)
    with pytest.raises(RuntimeError, match='weights-only'):
        load_checkpoint(str(path))


@pytest.mark.parametrize('name', ['pola_pvt_micro_LLLL.pt', 'pola_swin_micro_LLSS.pt'])
@pytest.mark.parametrize('target',
                         ['converted', 'converted_no_prefix', 'official', 'bare_official'])
def test_pretrained_init_cfg(golden_dir, tmp_path, name, target):
    data = load_golden(golden_dir, name)
    official = save_official(tmp_path / 'official.pth', data['state_dict'])
    prefix = 'backbone.'
    if target.startswith('converted'):
        checkpoint = tmp_path / 'converted.pth'
        convert_official_checkpoint(str(official), str(checkpoint))
        if target == 'converted_no_prefix':
            prefix = None
    elif target == 'official':
        checkpoint = official
    else:
        checkpoint = tmp_path / 'bare.pth'
        torch.save(data['state_dict'], checkpoint)
    backbone = _backbone(
        data, init_cfg=dict(type='Pretrained', checkpoint=str(checkpoint), prefix=prefix))
    backbone.init_weights()
    for ours, ref in zip(_raw_stages(backbone, data['input']), data['stage_outputs']):
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)


def test_missing_checkpoint_is_named(golden_dir, tmp_path):
    missing = str(tmp_path / 'nope' / 'pola_pvt_t.pth')
    backbone = PolaPVT(init_cfg=dict(type='Pretrained', checkpoint=missing))
    with pytest.raises(FileNotFoundError, match='nope/pola_pvt_t.pth'):
        backbone.init_weights()


def test_wrong_family_is_named(golden_dir, tmp_path):
    data = load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')
    official = save_official(tmp_path / 'official.pth', data['state_dict'])
    backbone = PolaSwin(init_cfg=dict(type='Pretrained', checkpoint=str(official)))
    with pytest.raises(ValueError, match='Pola-PVT'):
        backbone.init_weights()


def test_wrong_prefix_is_named(golden_dir, tmp_path):
    data = load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')
    dst = tmp_path / 'converted.pth'
    convert_official_checkpoint(
        str(save_official(tmp_path / 'o.pth', data['state_dict'])), str(dst))
    backbone = _backbone(
        data, init_cfg=dict(type='Pretrained', checkpoint=str(dst), prefix='model.'))
    with pytest.raises(KeyError, match="prefix 'model.'"):
        backbone.init_weights()


def test_checkpoint_that_does_not_fit_is_named(golden_dir, tmp_path):
    data = load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')
    official = str(save_official(tmp_path / 'official.pth', data['state_dict']))
    cfg = backbone_cfg(data['kind'], data['arch'])
    cfg.pop('type')
    with pytest.raises(ValueError, match=r'shape mismatches.*dwc\.weight'):
        PolaPVT(
            **{
                **cfg, 'kernel_size': 3
            }, init_cfg=dict(type='Pretrained', checkpoint=official)).init_weights()
    with pytest.raises(KeyError, match=r'missing keys.*attn\.q\.weight'):
        PolaPVT(
            **{
                **cfg, 'attn_types': 'LLLS'
            }, init_cfg=dict(type='Pretrained', checkpoint=official)).init_weights()


def test_swin_output_norms_are_optional(golden_dir, tmp_path):
    data = load_golden(golden_dir, 'pola_swin_micro_LLSS.pt')
    official = str(save_official(tmp_path / 'official.pth', data['state_dict']))
    for out_indices in [(0, 1, 2, 3), (1, 2)]:
        backbone = _backbone(
            data, out_indices=out_indices, init_cfg=dict(type='Pretrained', checkpoint=official))
        backbone.init_weights()
        for ours, ref in zip(_raw_stages(backbone, data['input']), data['stage_outputs']):
            torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)
        if 3 in out_indices:  # the official final norm is norm3; norm0 keeps its init
            torch.testing.assert_close(backbone.norm3.weight, data['state_dict']['norm.weight'])
            torch.testing.assert_close(backbone.norm0.weight.detach(), torch.ones(16))


def test_checkpoint_from_an_http_url(golden_dir, tmp_path, monkeypatch):
    """http(s) checkpoints are fetched once into torch's hub cache (a server on
    this machine's loopback stands in for a remote host)."""
    import functools
    import http.server
    import threading
    data = load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')
    serve_dir = tmp_path / 'served'
    serve_dir.mkdir()
    save_official(serve_dir / 'pola_official.pth', data['state_dict'])
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(serve_dir))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f'http://127.0.0.1:{server.server_address[1]}/pola_official.pth'
        backbone = _backbone(data, init_cfg=dict(type='Pretrained', checkpoint=url))
        backbone.init_weights()
    finally:
        server.shutdown()
        server.server_close()
    assert (tmp_path / 'torch_home' / 'hub' / 'checkpoints' / 'pola_official.pth').is_file()
    for ours, ref in zip(_raw_stages(backbone, data['input']), data['stage_outputs']):
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)


def _free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def test_mmengine_scheme_through_checkpoint_loader(golden_dir, tmp_path, monkeypatch):
    """open-mmlab:// names resolve through mmengine's CheckpointLoader (here to a file
    under $MMENGINE_HOME, as mmengine's own open_mmlab.json allows)."""
    import json
    data = load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')
    home = tmp_path / 'mmengine_home'
    (home / 'weights').mkdir(parents=True)
    save_official(home / 'weights' / 'pola.pth', data['state_dict'])
    (home / 'open_mmlab.json').write_text(json.dumps({'pola_micro': 'weights/pola.pth'}))
    monkeypatch.setenv('MMENGINE_HOME', str(home))
    backbone = _backbone(
        data, init_cfg=dict(type='Pretrained', checkpoint='open-mmlab://pola_micro'))
    backbone.init_weights()
    for ours, ref in zip(_raw_stages(backbone, data['input']), data['stage_outputs']):
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)


def test_registered_scheme_cannot_switch_weights_only_off(tmp_path, monkeypatch):
    """A loader registered with CheckpointLoader that asks torch for weights_only=False
    (as torch.hub's does) still loads weights-only."""
    from mmengine.runner.checkpoint import CheckpointLoader

    from polaformer_mm.utils.checkpoint_io import CheckpointError

    class Payload:

        def __reduce__(self):
            return (os.getcwd, ())

    torch.save({'state_dict': {'w': torch.ones(2)}}, tmp_path / 'good.pth')
    torch.save({'state_dict': {'w': torch.ones(2)}, 'x': Payload()}, tmp_path / 'evil.pth')
    monkeypatch.setattr(CheckpointLoader, '_schemes', dict(CheckpointLoader._schemes))

    def load_from_polatest(filename, map_location=None):
        return torch.load(
            tmp_path / filename[len('polatest://'):], map_location=map_location, weights_only=False)

    CheckpointLoader.register_scheme('polatest://', load_from_polatest)
    obj = load_checkpoint('polatest://good.pth')
    assert torch.equal(obj['state_dict']['w'], torch.ones(2))
    with pytest.raises(CheckpointError, match='refuses .*getcwd'):
        load_checkpoint('polatest://evil.pth')
    assert 'TORCH_FORCE_WEIGHTS_ONLY_LOAD' not in os.environ  # the scope is left


def test_unreachable_url_hints_at_pretrained():
    url = f'http://127.0.0.1:{_free_port()}/resnet50_v1c.pth'
    with pytest.warns(DeprecationWarning, match='pretrained is deprecated'):
        backbone = PolaPVT(pretrained=url)
    with pytest.raises(RuntimeError, match='could not be fetched.*pretrained=None'):
        backbone.init_weights()
    with pytest.raises(ValueError, match='not both'):
        PolaPVT(pretrained='a.pth', init_cfg=dict(type='Pretrained', checkpoint='a.pth'))
