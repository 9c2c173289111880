import os.path as osp
import subprocess
import sys

import torch

from ..test_models._golden import build_classifier, load_golden
from ..test_models._official_files import save_official

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def test_cli_converts_and_loads_strict(golden_dir, tmp_path):
    for name in ('pola_pvt_micro_LLLL.pt', 'pola_swin_micro_LLSS.pt'):
        data = load_golden(golden_dir, name)
        src = save_official(tmp_path / f'official_{name}', data['state_dict'])
        dst = tmp_path / f'mm_{name}'
        proc = subprocess.run(
            [sys.executable, osp.join(ROOT, 'tools/model_converters/official2mm.py'),
             str(src), str(dst)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert 'wrote' in proc.stdout
        model = build_classifier(data)
        model.load_state_dict(torch.load(dst, weights_only=True)['state_dict'],
                              strict=True)
        with torch.no_grad():
            logits = model.eval()(data['input'], mode='tensor')
        torch.testing.assert_close(logits, data['logits'], rtol=0, atol=1e-4)


def test_cli_names_a_missing_source(tmp_path):
    proc = subprocess.run(
        [sys.executable, osp.join(ROOT, 'tools/model_converters/official2mm.py'),
         str(tmp_path / 'missing.pth'), str(tmp_path / 'out.pth')],
        capture_output=True, text=True)
    assert proc.returncode != 0
    assert 'missing.pth' in proc.stderr
