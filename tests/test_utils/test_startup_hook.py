"""The start-up hook makes the import order of torchvision / mmdet / mmseg and
polaformer_mm irrelevant (on CPU torch with PyPI's CUDA torchvision).

Each case runs in a fresh virtualenv (made in a second, without pip) that sees the test
interpreter's packages and, where the case says so, has the hook written into its own
site-packages exactly as ``make install`` writes it.
"""
import os
import os.path as osp
import runpy
import subprocess
import sys
import sysconfig
import textwrap
import warnings

import pytest

from polaformer_mm.utils import startup_hook, torchvision_compat
from polaformer_mm.utils.torchvision_compat import stand_in_active

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
needs_stand_in = pytest.mark.skipif(
    not stand_in_active(), reason="torchvision's own ops load here; nothing to stand in for")


def _venv(tmp_path, with_hook):
    root = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(root)], check=True)
    site_dir = subprocess.run([
        str(root / 'bin' / 'python'), '-c',
        "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    ],
                              check=True,
                              capture_output=True,
                              text=True).stdout.strip()
    # the packages of the test interpreter, with their own .pth files processed, except
    # the hook's own (``make install`` writes it there; this venv decides for itself)
    base = sysconfig.get_paths()['purelib']
    with open(osp.join(site_dir, 'base_packages.pth'), 'w') as f:
        f.write(f'import os, site, sys; sys.path.append({base!r}); '
                f'[site.addpackage({base!r}, n, set()) for n in sorted(os.listdir({base!r})) '
                f"if n.endswith('.pth') and n != {startup_hook.PTH_NAME!r}]\n")
    if with_hook:
        subprocess.run([str(root / 'bin' / 'python'), startup_hook.__file__],
                       check=True,
                       capture_output=True,
                       env=_env())
    return str(root / 'bin' / 'python'), site_dir


def _env():
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS='1')
    env.pop('PYTHONWARNINGS', None)
    return env


def _run(python, code):
    return subprocess.run([python, '-c', textwrap.dedent(code)],
                          capture_output=True,
                          text=True,
                          env=_env(),
                          timeout=300)


def test_write_is_idempotent(tmp_path, monkeypatch):
    first = startup_hook.write_startup_hook(str(tmp_path))
    texts = [open(p).read() for p in first]
    second = startup_hook.write_startup_hook(str(tmp_path))
    assert first == second
    assert [open(p).read() for p in second] == texts
    assert sorted(os.listdir(tmp_path)) == sorted(
        ['__pycache__', startup_hook.PTH_NAME, startup_hook.MODULE_NAME + '.py'])
    assert texts[1] == f'import {startup_hook.MODULE_NAME}\n'
    with open(startup_hook.__file__) as f:
        assert texts[0] == f.read()
    # the command the warning and docs/notes/faq.md name
    other = tmp_path.parent / (tmp_path.name + '_other')
    monkeypatch.setattr(sys, 'argv', ['startup_hook', str(other)])
    runpy.run_module('polaformer_mm.utils.startup_hook', run_name='__main__')
    assert sorted(os.listdir(other)) == sorted(os.listdir(tmp_path))


@needs_stand_in
def test_without_hook_torchvision_first_fails(tmp_path):
    """What the hook is for: without it, importing torchvision first fails."""
    python, _ = _venv(tmp_path, with_hook=False)
    proc = _run(python, 'import torchvision')
    assert proc.returncode != 0
    assert 'operator torchvision::nms does not exist' in proc.stderr


def test_warning_names_the_fix_when_the_hook_is_missing(monkeypatch):
    monkeypatch.setattr(torchvision_compat, 'startup_hook_installed', lambda: False)
    with pytest.warns(
            torchvision_compat.TorchvisionOpsWarning,
            match='python -m polaformer_mm.utils.startup_hook'):
        torchvision_compat.warn_if_hook_missing()
    monkeypatch.setattr(torchvision_compat, 'startup_hook_installed', lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        torchvision_compat.warn_if_hook_missing()


@needs_stand_in
@pytest.mark.parametrize(
    'code', [
        """
        import mmseg.apis
        import polaformer_mm
    """,
        """
        import torchvision, torch
        import polaformer_mm
        boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
        keep = torch.ops.torchvision.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)
        assert keep.tolist() == [0, 2], keep
        from polaformer_mm.utils import torchvision_compat
        assert torchvision_compat.stand_in_active()  # one module: the hook's is reused
    """,
        """
        import mmdet.models
    """,
    ],
    ids=['mmseg.apis-first', 'torchvision-first', 'mmdet.models-alone'])
def test_with_hook_import_order_does_not_matter(tmp_path, code):
    python, _ = _venv(tmp_path, with_hook=True)
    proc = _run(python, textwrap.dedent(code) + "print('ok')\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith('ok')
    assert 'TorchvisionOpsWarning' not in proc.stderr


def test_hook_costs_no_import_at_start_up(tmp_path):
    python, _ = _venv(tmp_path, with_hook=True)
    proc = _run(
        python, """
        import sys
        assert '_polaformer_mm_startup' in sys.modules
        heavy = [m for m in ('torch', 'numpy', 'polaformer_mm') if m in sys.modules]
        assert not heavy, heavy
        print(type(sys.meta_path[0]).__name__)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == 'TorchvisionImportHook'


def test_hook_installed_in_this_environment_is_current():
    """After ``make install`` the running virtualenv carries the current hook."""
    site_dir = sysconfig.get_paths()['purelib']
    installed = osp.join(site_dir, startup_hook.MODULE_NAME + '.py')
    if not osp.isfile(osp.join(site_dir, startup_hook.PTH_NAME)):
        pytest.skip('the start-up hook is not installed here (make install writes it)')
    with open(installed) as f, open(startup_hook.__file__) as g:
        assert f.read() == g.read(), 'stale start-up hook: run make install'
