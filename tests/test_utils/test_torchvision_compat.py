import subprocess
import sys
import textwrap

import torch

from polaformer_mm.utils.torchvision_compat import nms_cpu


def _random_boxes(n, seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 100
    wh = torch.rand(n, 2, generator=g) * 40 + 1
    return torch.cat([xy, xy + wh], dim=1), torch.rand(n, generator=g)


def test_nms_cpu_matches_mmcv_compiled_nms():
    from mmcv.ops import nms as mmcv_nms
    for seed in range(5):
        boxes, scores = _random_boxes(300, seed)
        _, keep_mmcv = mmcv_nms(boxes, scores, 0.5)
        keep = nms_cpu(boxes, scores, 0.5)
        # mmcv's op returns kept indices sorted by score, as torchvision does
        assert torch.equal(keep, keep_mmcv.long())
    assert nms_cpu(torch.zeros(0, 4), torch.zeros(0), 0.5).numel() == 0


def _degenerate_boxes(n, seed):
    """Boxes on a coarse grid, a third of them zero-width, zero-height or points,
    with distinct scores (ties aside)."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.randint(0, 12, (n, 2), generator=g).float()
    wh = torch.randint(0, 4, (n, 2), generator=g).float()
    kind = torch.randint(0, 3, (n, ), generator=g)
    wh[kind == 1, 0] = 0
    wh[kind == 2] = 0
    return torch.cat([xy, xy + wh], dim=1), torch.randperm(n, generator=g).float() / n


def test_nms_cpu_keeps_zero_area_boxes_as_mmcv_does():
    from mmcv.ops import nms as mmcv_nms
    points = torch.tensor([[0., 0., 0., 0.], [5., 5., 5., 5.], [0., 0., 0., 0.], [1., 1., 1., 5.],
                           [0., 0., 10., 10.]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5])
    # disjoint (and even coinciding) zero-area boxes have IoU 0 / 0: not above any
    # threshold, so the compiled kernels keep every one of them
    assert nms_cpu(points, scores, 0.5).tolist() == [0, 1, 2, 3, 4]
    for seed in range(20):
        boxes, scores = _degenerate_boxes(60, seed)
        for thr in (0.0, 0.3, 0.7):
            _, keep_mmcv = mmcv_nms(boxes, scores, thr)
            assert nms_cpu(boxes, scores, thr).tolist() == keep_mmcv.tolist(), (seed, thr)


def test_torchvision_and_mmpretrain_import_in_a_fresh_process():
    code = textwrap.dedent("""
        import polaformer_mm, torch, torchvision, torchvision.ops
        import mmpretrain.models, mmpretrain.datasets
        boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
        # torch.ops.torchvision.nms is torchvision's own op when its extension loads,
        # else the stand-in (torchvision.ops.nms itself still refuses without the
        # extension: it checks for the compiled library first)
        keep = torch.ops.torchvision.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)
        assert keep.tolist() == [0, 2], keep
        print('ok', torchvision.__version__)
    """)
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith('ok')
