import os.path as osp
import subprocess
import sys

import pytest
import torch

from tests import REPO
from ..test_models._golden import build_classifier, load_golden
from ..test_models._official_files import save_official

pytestmark = pytest.mark.slow


def _convert_and_check(data, src, dst):
    """tools/model_converters/official2mm.py SRC DST; DST loads strictly into the
    classifier and gives the official logits."""
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/model_converters/official2mm.py'),
        str(src),
        str(dst)
    ],
                          capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert 'wrote' in proc.stdout
    model = build_classifier(data)
    model.load_state_dict(torch.load(dst, weights_only=True)['state_dict'], strict=True)
    with torch.no_grad():
        logits = model.eval()(data['input'], mode='tensor')
    torch.testing.assert_close(logits, data['logits'], rtol=0, atol=1e-4)


def test_cli_converts_and_loads_strict(golden_dir, tmp_path):
    for name in ('pola_pvt_micro_LLLL.pt', 'pola_swin_micro_LLSS.pt'):
        data = load_golden(golden_dir, name)
        src = save_official(tmp_path / f'official_{name}', data['state_dict'])
        _convert_and_check(data, src, tmp_path / f'mm_{name}')


def test_cli_converts_an_official_file_saved_from_ddp(golden_dir, tmp_path):
    """The official training code saved from a DDP-wrapped model: keys ``module.*``."""
    data = load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')
    src = save_official(tmp_path / 'official_ddp.pth', {
        f'module.{k}': v
        for k, v in data['state_dict'].items()
    })
    _convert_and_check(data, src, tmp_path / 'converted.pth')


def test_cli_names_a_missing_source(tmp_path):
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/model_converters/official2mm.py'),
        str(tmp_path / 'missing.pth'),
        str(tmp_path / 'out.pth')
    ],
                          capture_output=True,
                          text=True)
    assert proc.returncode == 1
    assert 'missing.pth' in proc.stderr
    assert 'Traceback' not in proc.stderr  # one line naming the problem


def test_cli_names_a_file_that_is_no_checkpoint(tmp_path):
    src = tmp_path / 'notes.pth'
    src.write_text('not a checkpoint')
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/model_converters/official2mm.py'),
        str(src),
        str(tmp_path / 'out.pth')
    ],
                          capture_output=True,
                          text=True)
    assert proc.returncode == 1
    assert 'Traceback' not in proc.stderr
    assert "official2mm: error: official checkpoint '" in proc.stderr
    assert 'is not a checkpoint' in proc.stderr


def test_refuses_to_overwrite_its_source(golden_dir, tmp_path, monkeypatch):
    """SRC == DST in any spelling: the same path, a relative one, a symlink to SRC, a
    path through a symlinked folder, a hard link."""
    import os

    import pytest

    from polaformer_mm.models.official_weights import convert_official_checkpoint
    data = load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')
    src = save_official(tmp_path / 'official.pth', data['state_dict'])
    original = src.read_bytes()
    (tmp_path / 'link.pth').symlink_to(src)
    (tmp_path / 'alias').symlink_to(tmp_path, target_is_directory=True)
    os.link(src, tmp_path / 'hard.pth')
    (tmp_path / 'sub').mkdir()
    monkeypatch.chdir(tmp_path / 'sub')
    for dst in (str(src), '../official.pth', str(tmp_path / 'link.pth'),
                str(tmp_path / 'alias' / 'official.pth'), str(tmp_path / 'hard.pth'),
                str(tmp_path / 'sub' / '..' / 'official.pth')):
        with pytest.raises(ValueError, match='is the source file'):
            convert_official_checkpoint(str(src), dst)
        assert src.read_bytes() == original, dst
    # through the command line too, with the source left intact
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/model_converters/official2mm.py'),
        str(src), '../official.pth'
    ],
                          capture_output=True,
                          text=True)
    assert proc.returncode != 0
    assert 'is the source file' in proc.stderr
    assert src.read_bytes() == original
    # a different DST still works, and no temporary file is left behind
    convert_official_checkpoint(str(src), str(tmp_path / 'converted.pth'))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        'alias', 'converted.pth', 'hard.pth', 'link.pth', 'official.pth', 'sub'
    ]


def test_cli_refuses_an_official_file_with_nan_weights(golden_dir, tmp_path):
    """A damaged official file (NaN in a tensor) is named, with its first bad key, and
    nothing is written."""
    data = load_golden(golden_dir, 'pola_pvt_micro_LLLL.pt')
    state = {k: v.clone() for k, v in data['state_dict'].items()}
    key = next(k for k, v in state.items() if v.is_floating_point() and 'attn.q' in k)
    state[key].view(-1)[0] = float('nan')
    src = save_official(tmp_path / 'official_nan.pth', state)
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/model_converters/official2mm.py'),
        str(src),
        str(tmp_path / 'out.pth')
    ],
                          capture_output=True,
                          text=True)
    assert proc.returncode == 1, proc.stdout
    assert 'not finite' in proc.stderr and key in proc.stderr, proc.stderr
    assert 'Traceback' not in proc.stderr
    assert not osp.exists(tmp_path / 'out.pth')
