"""``import polaformer_mm``, the op and both backbones need torch, mmengine and mmcv's
Python part only: no mmdet / mmseg / mmpretrain is imported, and no compiled mmcv op is
loaded, so a bare GPU machine can check them with a few small wheels."""
import pytest

from .._fresh_python import fresh_python_json

pytestmark = pytest.mark.slow

SCRIPT = r'''
import json, sys
import torch
import polaformer_mm
after_import = sorted(sys.modules)
from polaformer_mm import PolaPVT, PolaSwin
from polaformer_mm.ops import pola_linear_attention
q = torch.randn(1, 2, 16, 8, requires_grad=True)
pola_linear_attention(q, torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8),
                      torch.zeros(1, 2, 1, 8)).sum().backward()
for cls in (PolaPVT, PolaSwin):
    model = cls(arch='tiny', drop_path_rate=0.1)
    model.init_weights()
    sum(o.mean() for o in model(torch.randn(1, 3, 64, 80))).backward()
print('@@modules ' + json.dumps(dict(after_import=after_import, after_run=sorted(sys.modules))))
'''


@pytest.fixture(scope='module')
def modules():
    return fresh_python_json(SCRIPT, '@@modules')


def _top(names):
    return {n.split('.')[0] for n in names}


@pytest.mark.parametrize('when', ['after_import', 'after_run'])
def test_no_downstream_codebase_is_imported(modules, when):
    assert not _top(modules[when]) & {'mmdet', 'mmseg', 'mmpretrain'}


def test_no_compiled_mmcv_op_is_loaded(modules):
    loaded = set(modules['after_run'])
    assert 'mmcv._ext' not in loaded
    assert not [m for m in loaded if m == 'mmcv.ops' or m.startswith('mmcv.ops.')]
