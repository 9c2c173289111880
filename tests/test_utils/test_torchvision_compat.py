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
