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
