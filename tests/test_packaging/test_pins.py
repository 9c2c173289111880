"""Each test stack is what its requirement files pin: `make install` (the pinned stack:
requirements/build, runtime, tests, mim and deploy) or `make install STACK=oldest` (build,
oldest, mim and deploy) writes the stack's name into its venv, and the installed distributions are
checked against that stack's files only. Outside such a venv (a user's own environment)
there are no pins to check. openmim is installed without its declared dependencies, whose
chain (opendatalab -> openxlab) would downgrade setuptools beneath the stack."""
import os.path as osp
import re
import sys
from importlib import metadata

import pytest

from tests import REPO

# 'name==version', or 'name===version' (that exact version string: no local '+cpu' build)
PIN = re.compile(r'^([A-Za-z0-9_.\-]+)(===?)([^\s;#]+)')
#: The requirement files of each stack, as the Makefile installs them.
STACKS = {
    'pinned': ('build.txt', 'runtime.txt', 'tests.txt', 'mim.txt', 'deploy.txt'),
    'oldest': ('build.txt', 'oldest.txt', 'mim.txt', 'deploy.txt'),
}
MARKER = osp.join(sys.prefix, '.polaformer_mm-stack')


def _pins(stack):
    pins = {}
    for name in STACKS[stack]:
        with open(osp.join(REPO, 'requirements', name)) as f:
            for line in f:
                match = PIN.match(line.strip())
                if match:
                    pins[match.group(1)] = (match.group(3), name, match.group(2) == '===')
    return pins


def _installed_stack():
    if not osp.isfile(MARKER):
        return None
    with open(MARKER) as f:
        return f.read().strip()


STACK = _installed_stack()
needs_stack = pytest.mark.skipif(
    STACK is None, reason=f'not a venv made by `make install` (no {MARKER}): no pins to check')


@pytest.mark.parametrize('stack', sorted(STACKS))
def test_requirement_files_pin_the_stack(stack):
    pins = _pins(stack)
    for name in ('setuptools', 'torch', 'numpy', 'mmengine', 'mmcv', 'mmdet', 'mmsegmentation',
                 'mmpretrain', 'openmim', 'pandas', 'pytest'):
        assert name in pins, f'{name} is not pinned for the {stack} stack ({STACKS[stack]})'


def test_both_stacks_lie_in_the_range_setup_py_states():
    with open(osp.join(REPO, 'setup.py')) as f:
        setup = f.read()
    for stack in STACKS:
        torch_pin = tuple(int(x) for x in _pins(stack)['torch'][0].split('.')[:2])
        low = tuple(int(x) for x in re.search(r"'torch>=(\d+)\.(\d+)", setup).groups())
        high = tuple(int(x) for x in re.search(r"'torch>=[\d.]+,<(\d+)\.(\d+)", setup).groups())
        assert low <= torch_pin < high, (stack, torch_pin, low, high)
    assert "'torch>=2.1," in setup  # the low stack is the low end


@needs_stack
def test_the_venv_names_a_known_stack():
    assert STACK in STACKS, f'{MARKER} names {STACK!r}, not one of {sorted(STACKS)}'


@needs_stack
@pytest.mark.parametrize('name', sorted(set(_pins('pinned')) | set(_pins('oldest'))))
def test_installed_version_is_the_pinned_one(name):
    pins = _pins(STACK)
    if name not in pins:
        pytest.skip(f'{name} is not pinned in the {STACK} stack')
    pinned, where, exact = pins[name]
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        pytest.fail(f'{name}=={pinned} (requirements/{where}) is not installed')
    assert (installed if exact else installed.split('+')[0]) == pinned, (
        f'{name}: installed {installed}, requirements/{where} pins {pinned}')


@needs_stack
@pytest.mark.parametrize('name', ['opendatalab', 'openxlab'])
def test_openmim_dependency_chain_not_installed(name):
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version(name)
