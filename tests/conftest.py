import os.path as osp

import pytest

import polaformer_mm  # noqa: F401  (registers the models; lets torchvision import on CPU torch)

DATA_DIR = osp.join(osp.dirname(osp.abspath(__file__)), 'data')
GOLDEN_DIR = osp.join(DATA_DIR, 'golden')


@pytest.fixture(scope='session')
def golden_dir():
    return GOLDEN_DIR
