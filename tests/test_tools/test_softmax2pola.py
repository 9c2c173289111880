"""tools/model_converters/softmax2pola.py: a softmax file -> a Pola backbone file that
loads strictly through init_cfg type='Pretrained'."""
import os.path as osp
import subprocess
import sys

import pytest
import torch

from polaformer_mm.models import PolaPVT, PolaSwin
from tests import REPO
from tests._tools import load_tool
from ..test_models._softmax_files import PVT_POLA, mmdet_pvt, mmdet_swin, pvt_release_layout, save

TOOL = 'model_converters/softmax2pola.py'
pytest.importorskip('mmdet')


def test_converter_output_loads_strictly_through_pretrained(tmp_path, capsys):
    src = save(tmp_path / 'pvt_release.pth', pvt_release_layout(mmdet_pvt().state_dict()))
    config = tmp_path / 'pola.py'
    config.write_text(f'model = dict(backbone=dict(type="PolaPVT", arch={PVT_POLA["arch"]!r}, '
                      "attn_types='LLSS', init_cfg=dict(type='Pretrained', checkpoint='x.pth')))\n")
    dst = tmp_path / 'out' / 'pola.pth'
    load_tool(TOOL).main([src, str(dst), '--config', str(config), '--verbose'])
    out = capsys.readouterr().out
    assert "PolaPVT(arch=" in out and "'LLSS'" in out
    assert '6 loaded in part' in out and 'unused (classifier head): head.weight' in out
    assert 'loaded  layers.0.blocks.0.attn.qg.weight <- rows 0:8 <- block1.0.attn.q.weight' in out
    assert f'wrote {dst}' in out
    written = torch.load(dst, weights_only=True)
    assert written['meta']['layout'] == 'the official PVT v1 release (whai362/PVT)'
    model = PolaPVT(
        **PVT_POLA,
        attn_types='LLSS',
        init_cfg=dict(type='Pretrained', checkpoint=str(dst), prefix='backbone.'))
    model.init_weights()  # strict: any missing or extra key is an error
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, written['state_dict']['backbone.' + key], rtol=0, atol=0)
    # the same seed, the same file
    again = tmp_path / 'again.pth'
    load_tool(TOOL).main([src, str(again), '--config', str(config)])
    for key, value in torch.load(again, weights_only=True)['state_dict'].items():
        assert torch.equal(value, written['state_dict'][key])


def test_converter_errors_are_one_line(tmp_path, capsys):
    src = save(tmp_path / 'swin.pth', mmdet_swin().state_dict())
    with pytest.raises(SystemExit) as exit_info:
        load_tool(TOOL).main([src, str(tmp_path / 'out.pth'), '--backbone', 'PolaPVT'])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.splitlines()[-1]  # the one line of the error
    assert err.startswith('softmax2pola: error: ') and 'is a Swin checkpoint' in err
    with pytest.raises(SystemExit):
        load_tool(TOOL).main([src, src, '--backbone', 'PolaSwin'])
    assert 'would overwrite' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_tool(TOOL).main([src, str(tmp_path / 'o.pth'), '--backbone', 'ResNet'])
    assert 'not a Pola backbone' in capsys.readouterr().err


@pytest.mark.slow
def test_cli_warm_starts_a_repository_config(tmp_path):
    """As a user runs it: a repository config (the Pola-Swin-T Mask R-CNN) and
    a full-size mmdet Swin-T file, then a strict Pretrained load."""
    from mmdet.models.backbones import SwinTransformer
    torch.manual_seed(0)
    src = save(tmp_path / 'swin_t.pth', SwinTransformer().state_dict(), 'backbone.')
    config = osp.join(REPO, 'configs/pola_swin/mask-rcnn_pola-swin-t-p4-w7_fpn_ms-crop-1x_coco.py')
    dst = tmp_path / 'pola_swin_t.pth'
    proc = subprocess.run(
        [sys.executable,
         osp.join(REPO, 'tools', TOOL), src,
         str(dst), '--config', config],
        capture_output=True,
        text=True)
    assert proc.returncode == 0, proc.stderr
    assert 'PolaSwin(arch=' in proc.stdout and 'wrote' in proc.stdout
    model = PolaSwin(
        arch='tiny', attn_types='LLSS', init_cfg=dict(type='Pretrained', checkpoint=str(dst)))
    model.init_weights()


@pytest.mark.slow
def test_cli_builds_pola_vit_by_name_in_a_fresh_process(tmp_path):
    """``--backbone PolaViT`` in a process that has not imported PolaViT's module (the
    registry holds its builder until then): a DeiT-T file in the DeiT / timm release
    layout is warm-started, and the file loads strictly."""
    from polaformer_mm.models import PolaViT
    from ..test_models._softmax_files import deit_release_layout, mmpretrain_deit
    deit = mmpretrain_deit(arch='deit-tiny', img_size=224, out_indices=(11, ))
    src = tmp_path / 'deit_tiny_patch16_224.pth'
    torch.save({'model': deit_release_layout(deit.state_dict())}, src)
    dst = tmp_path / 'pola_deit_t.pth'
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools', TOOL),
        str(src),
        str(dst), '--backbone', 'PolaViT', '--arch', 'deit-tiny'
    ],
                          capture_output=True,
                          text=True,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "PolaViT(arch='deit-tiny'" in proc.stdout and '24 loaded in part' in proc.stdout
    model = PolaViT(
        arch='deit-tiny', init_cfg=dict(type='Pretrained', checkpoint=str(dst), prefix='backbone.'))
    model.init_weights()
