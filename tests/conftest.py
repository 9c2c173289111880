import os.path as osp

import pytest

import polaformer_mm  # noqa: F401  (registers the models)

DATA_DIR = osp.join(osp.dirname(osp.abspath(__file__)), 'data')
GOLDEN_DIR = osp.join(DATA_DIR, 'golden')


@pytest.fixture(scope='session')
def golden_dir():
    return GOLDEN_DIR


@pytest.fixture(scope='session')
def synthetic_data_root(tmp_path_factory):
    """The small synthetic COCO / ADE20K-layout dataset of ``tests/_smoke.py``, generated
    once per session. Shared: tests that change files of their dataset make their own."""
    from ._smoke import synthetic_root
    return synthetic_root(tmp_path_factory.mktemp('data'))


@pytest.fixture(autouse=True)
def _restore_default_scope():
    """A test that calls ``init_default_scope`` (as the tools do) sets mmengine's global
    default scope for every test after it; each test starts from the scopes it found."""
    from mmengine.registry import DefaultScope
    saved = dict(DefaultScope._instance_dict)
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(saved)
