"""The pinned stack is what is installed: requirements/*.txt pins (build, runtime, tests
and the lean openmim set) against the installed distributions. openmim is installed
without its declared dependencies, whose chain (opendatalab -> openxlab) would downgrade
setuptools beneath the stack."""
import glob
import os.path as osp
import re
from importlib import metadata

import pytest

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
PIN = re.compile(r'^([A-Za-z0-9_.\-]+)==([^\s;#]+)')


def _pins():
    pins = {}
    for path in sorted(glob.glob(osp.join(ROOT, 'requirements', '*.txt'))):
        with open(path) as f:
            for line in f:
                match = PIN.match(line.strip())
                if match:
                    pins[match.group(1)] = (match.group(2), osp.basename(path))
    return pins


def test_requirement_files_pin_the_stack():
    pins = _pins()
    for name in ('setuptools', 'torch', 'mmcv', 'mmdet', 'mmsegmentation', 'mmpretrain', 'openmim',
                 'pandas'):
        assert name in pins, f'{name} is not pinned in requirements/*.txt'


@pytest.mark.parametrize('name', sorted(_pins()))
def test_installed_version_is_the_pinned_one(name):
    pinned, where = _pins()[name]
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        pytest.fail(f'{name}=={pinned} ({where}) is not installed')
    assert installed.split('+')[0] == pinned, (
        f'{name}: installed {installed}, requirements/{where} pins {pinned}')


@pytest.mark.parametrize('name', ['opendatalab', 'openxlab'])
def test_openmim_dependency_chain_not_installed(name):
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version(name)
