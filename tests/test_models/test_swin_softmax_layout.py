"""All-'S' PolaSwin warm-started from an mmdet Swin file: what docs/user_guides/warm_start.md
claims. Equal to mmdet's outputs where every map is larger than the window and a multiple
of it; different (the official layout) at a stage whose map is the window's size (mmdet
shifts it, the official code does not) and from the first stage that needs padding
(PolaSwin masks padded tokens out, mmdet attends to them)."""
import pytest
import torch

from polaformer_mm.models import PolaSwin
from polaformer_mm.models.warm_start import warm_start
from ._softmax_files import SWIN_POLA, mmdet_swin, save

pytest.importorskip('mmdet')
DEPTHS = [2, 2, 2, 2]  # every stage has a shifted (odd) block


@pytest.fixture(scope='module')
def pair(tmp_path_factory):
    theirs = mmdet_swin(depths=DEPTHS)
    theirs.eval()  # mmdet's Swin train() returns None
    path = save(tmp_path_factory.mktemp('swin') / 'swin_mm.pth', theirs.state_dict(), 'backbone.')
    arch = dict(SWIN_POLA['arch'], depths=DEPTHS)
    ours = PolaSwin(**dict(SWIN_POLA, arch=arch, attn_types='SSSS'))
    report = warm_start(ours, path, log=False)
    assert not report.new and not report.partial
    ours.eval()
    return ours, theirs


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize(
    'hw,equal_stages',
    [
        ((128, 128), 4),  # maps 32, 16, 8, 4: larger than the window (2), multiples of it
        ((64, 64), 3),  # stage 3's map is 2x2, the window: mmdet shifts it
        ((72, 72), 1),  # stage 1's map is 9x9: padded to 10x10 from stage 1 on
    ])
def test_all_softmax_swin_equals_mmdet_where_the_layouts_agree(pair, hw, equal_stages):
    ours, theirs = pair
    x = torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        rel = [_rel(a, b) for a, b in zip(ours(x), theirs(x))]
    assert all(r < 1e-5 for r in rel[:equal_stages]), rel
    assert all(r > 1e-3 for r in rel[equal_stages:]), rel
