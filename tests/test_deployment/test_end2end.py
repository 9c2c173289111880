"""End-to-end export (post-processing in the graph) through mmdeploy for onnxruntime: the
whole quickstart Mask R-CNN and Semantic FPN, small RetinaNet + Pola-PVT and UperNet +
Pola-Swin models, exported by the project's tools, run in onnxruntime with PyTorch's
predictions (same boxes and labels, same class maps) at the export size and others; and
the parts that need no mmdeploy: the exact adaptive pooling, the torch API shim, the box
matching, the deploy config checks.

The mmdeploy tests skip, saying so, where mmdeploy is not installed
(``pip install --no-deps -r requirements/deploy.txt``)."""
import os.path as osp
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config

from polaformer_mm import deployment
from polaformer_mm.engine.entry import load_config
from polaformer_mm.utils.compat import TORCHSCRIPT_ONNX_EXPORT, legacy_onnx_export_api
from tests import REPO
from .._tools import load_tool

QUICKSTART = osp.join(REPO, 'configs', 'quickstart')
MASK_RCNN = osp.join(QUICKSTART, 'mask-rcnn_pola-pvt-nano_fpn_synthetic.py')
SEM_FPN = osp.join(QUICKSTART, 'fpn_pola-pvt-nano_synthetic-seg.py')
DEPLOY_CONFIGS = osp.join(REPO, 'tools', 'deployment', 'configs')
MMDEPLOY_MISSING = deployment.mmdeploy_missing()
needs_mmdeploy = pytest.mark.skipif(MMDEPLOY_MISSING is not None, reason=str(MMDEPLOY_MISSING))


@pytest.fixture(autouse=True)
def _seeded():
    """Models built with random weights get the same weights whatever ran before: an
    argmax near a tie would otherwise depend on the order of the tests."""
    torch.manual_seed(0)


def _tool(name):
    return load_tool(f'deployment/{name}.py')


@pytest.mark.slow
def test_package_import_leaves_mmdeploy_unimported():
    """Importing the package, its rewrites included, imports no mmdeploy: the export
    registers the rewrites when it runs."""
    code = ('import sys, polaformer_mm.deployment; '
            'print(sorted(m for m in sys.modules if m.split(".")[0] == "mmdeploy"))')
    done = subprocess.run([sys.executable, '-c', code],
                          cwd=REPO,
                          capture_output=True,
                          text=True,
                          check=True)
    assert done.stdout.strip() == '[]', done.stdout


@pytest.mark.parametrize('hw', [(4, 4), (3, 3), (5, 7), (13, 9), (2, 2)])
@pytest.mark.parametrize('out', [1, 2, 3, 6, (2, 5), (None, 3)])
def test_adaptive_pooling_by_matmul_equals_torch(hw, out):
    x = torch.randn(2, 3, *hw)
    torch.testing.assert_close(
        deployment.adaptive_avg_pool2d_matmul(x, out), F.adaptive_avg_pool2d(x, out))


def test_adaptive_pooling_graph_pools_exactly_at_other_sizes(tmp_path):
    """One ONNX graph (opset 11, traced at 4x4) pools as F.adaptive_avg_pool2d at sizes
    whose bins differ from the export's."""

    class Pool(torch.nn.Module):

        def forward(self, x):
            return deployment.adaptive_avg_pool2d_matmul(x, 3)

    path = str(tmp_path / 'pool.onnx')
    torch.onnx.export(
        Pool(), (torch.randn(1, 2, 4, 4), ),
        path,
        input_names=['x'],
        dynamic_axes={'x': {
            2: 'h',
            3: 'w'
        }},
        opset_version=11,
        **TORCHSCRIPT_ONNX_EXPORT)
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    for hw in [(4, 4), (7, 5), (16, 16)]:
        x = torch.randn(1, 2, *hw)
        got = session.run(None, {'x': x.numpy()})[0]
        np.testing.assert_allclose(got, F.adaptive_avg_pool2d(x, 3).numpy(), atol=1e-6)


def test_legacy_onnx_export_api_is_scoped(tmp_path):
    import torch.onnx.symbolic_opset9 as opset9
    export, had_cast = torch.onnx.export, hasattr(opset9, '_cast_Long')
    with legacy_onnx_export_api():
        assert hasattr(opset9, '_cast_Long')
        assert (torch.onnx.export is not export) == bool(TORCHSCRIPT_ONNX_EXPORT)
        # a call written for the old API (no dynamo=) takes the TorchScript exporter,
        # which records a Python-side shape check as a trace does
        torch.onnx.export(torch.nn.Linear(3, 2), (torch.randn(1, 3), ), str(tmp_path / 'l.onnx'))
    assert torch.onnx.export is export and hasattr(opset9, '_cast_Long') == had_cast
    session = ort.InferenceSession(str(tmp_path / 'l.onnx'), providers=['CPUExecutionProvider'])
    assert session.run(None, {session.get_inputs()[0].name: np.ones((1, 3), np.float32)})


def test_match_boxes_pairs_same_labels_first():
    ref = torch.tensor([[0., 0., 10., 10.], [20., 20., 30., 30.], [50., 50., 60., 60.]])
    got = torch.tensor([[20., 20., 30., 31.], [0., 0., 10., 10.], [0., 0., 10., 10.]])
    index, ious = deployment.match_boxes(ref, torch.tensor([0, 1, 2]), got, torch.tensor([1, 2, 0]))
    # ref 0 (label 0) takes got 2 (label 0), not got 1 (label 2) of the same IoU
    assert index.tolist() == [2, 0, -1]
    torch.testing.assert_close(ious, torch.tensor([1., 100 / 110, 0.]))


def test_deploy_config_checks(tmp_path):
    path = osp.join(DEPLOY_CONFIGS, 'detection_onnxruntime_dynamic.py')
    cfg, dynamic = deployment.load_deploy_config(path)
    assert dynamic and cfg.onnx_config.output_names == ['dets', 'labels']
    static, dynamic = deployment.load_deploy_config(path, dynamic=False)
    assert not dynamic and 'dynamic_axes' not in static.onnx_config
    with pytest.raises(deployment.DeployConfigError, match='dynamic height and width'):
        deployment.load_deploy_config(static, dynamic=True)
    trt = Config.fromfile(path)
    trt.backend_config = dict(type='tensorrt')
    with pytest.raises(deployment.DeployConfigError, match="backend_config.type='tensorrt'"):
        deployment.load_deploy_config(trt)
    with pytest.raises(FileNotFoundError, match='deploy config not found'):
        deployment.load_deploy_config(str(tmp_path / 'none.py'))
    for task in deployment.DEPLOY_CONFIGS:
        assert osp.isfile(deployment.deploy_config_file(task))


def test_agreement_below_target_fails(capsys):
    args = _tool('pytorch2onnx').parse_args([MASK_RCNN, '--shape', '64', '64'])
    rows = [
        deployment.BoxAgreement((64, 64), (64, 64), 2, 10, 10, 1., 1., 1., 1., 0., 0.),
        deployment.BoxAgreement((48, 80), (64, 96), 2, 10, 9, .9, 0., 1., 1., 0., 0.)
    ]
    assert not _tool('pytorch2onnx').print_agreement(rows, args)
    assert 'lowest matched fraction 90.00%' in capsys.readouterr().out
    maps = [deployment.MapAgreement((64, 64), (64, 64), 1, 4096, 4090 / 4096)]
    assert not _tool('pytorch2onnx').print_agreement(maps, args)
    assert 'FAILED' in capsys.readouterr().out


@pytest.mark.slow
@needs_mmdeploy
def test_mask_rcnn_end_to_end_gives_pytorchs_boxes(tmp_path, capsys):
    import cv2
    folder = tmp_path / 'images'
    folder.mkdir()
    for i, image in enumerate(deployment.random_images(3, (64, 64), seed=1)):
        cv2.imwrite(str(folder / f'{i}.png'), image)
    out = str(tmp_path / 'mask-rcnn.onnx')
    result = _tool('pytorch2onnx').main([
        MASK_RCNN, '--shape', '64', '64', '--dynamic', '--out', out, '--images',
        str(folder), '--check-shapes', '48', '80'
    ])
    printed = capsys.readouterr().out
    assert result['ok'], printed
    assert result['task'] == 'instance-seg'
    assert not [op for op in result['ops'] if '::' in op]  # standard operators only
    assert {'NonMaxSuppression', 'RoiAlign', 'Log', 'Exp'} <= set(result['ops'])
    rows = result['rows']
    assert [(r.image, r.shape) for r in rows] == [((64, 64), (64, 64)), ((48, 80), (64, 96))]
    for r in rows:
        assert r.torch_boxes > 0 and r.matched == 1 and r.label_agreement == 1, r
        assert r.iou_min >= 0.99 and r.score_max_abs < 1e-4, r
    assert 'onnx.checker: ok' in printed and 'all standard ONNX' in printed


@pytest.mark.slow
@needs_mmdeploy
def test_semantic_fpn_end_to_end_with_the_deploy_tool(tmp_path, capsys):
    result = _tool('deploy').main([
        osp.join(DEPLOY_CONFIGS, 'segmentation_onnxruntime_dynamic.py'), SEM_FPN, '--work-dir',
        str(tmp_path), '--shape', '64', '64', '--check-shapes', '53', '83', '96', '72'
    ])
    printed = capsys.readouterr().out
    assert result['ok'], printed
    assert osp.isfile(osp.join(str(tmp_path), 'end2end.onnx'))
    assert [(r.shape, r.agreement) for r in result['rows']] == [((64, 64), 1.), ((53, 83), 1.),
                                                                ((96, 72), 1.)]
    assert 'same predictions' in printed


def _small(config, **options):
    cfg = load_config(config)
    cfg.merge_from_dict(options)
    return cfg


@pytest.mark.slow
@needs_mmdeploy
def test_retinanet_pola_pvt_end_to_end(tmp_path):
    cfg = _small(
        osp.join(REPO, 'configs', 'pola_pvt', 'retinanet_pola-pvt-t_fpn_1x_coco.py'), **{
            'model.backbone.arch': 'nano',
            'model.neck.in_channels': [32, 64, 160, 256],
            'model.neck.out_channels': 32,
            'model.bbox_head.in_channels': 32,
            'model.bbox_head.feat_channels': 32,
            'model.bbox_head.stacked_convs': 1,
        })
    # scores about 0.5 (the initial class bias gives 0.01, below score_thr): many
    # detections of 80 classes, from a checkpoint file as a user passes it
    model = deployment.build_model(cfg)
    torch.nn.init.zeros_(model.bbox_head.retina_cls.bias)
    checkpoint = str(tmp_path / 'retinanet.pth')
    torch.save({'state_dict': model.state_dict()}, checkpoint)
    export = deployment.export_end2end(cfg, checkpoint, str(tmp_path / 'retinanet.onnx'), (96, 128))
    assert export.task == 'detection' and export.output_names == ('dets', 'labels')
    images = deployment.random_images(2, seed=1)
    for r in deployment.compare_end2end(export, images, [(96, 128), (75, 150)]):
        assert r.torch_boxes == r.onnx_boxes == 200 and r.matched == 1, r  # 100 per image
        assert r.iou_min >= 0.99 and r.label_agreement == 1, r


@pytest.mark.slow
@needs_mmdeploy
def test_upernet_pola_swin_end_to_end_pools_exactly(tmp_path):
    """UperNet's pooling module (scales 1, 2, 3, 6) pools the right bins at every size:
    at 96x96 the last map is 3x3, at 128x128 4x4 (mmdeploy's own rewrite would pool with
    the 3x3 map's kernels there)."""
    cfg = _small(
        osp.join(REPO, 'configs', 'pola_swin', 'upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py'),
        **{
            'model.backbone.arch':
            dict(_delete_=True, embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4]),
            'model.decode_head.in_channels': [16, 32, 64, 128],
            'model.decode_head.channels':
            16,
            'model.auxiliary_head.in_channels':
            64,
            'model.auxiliary_head.channels':
            16,
        })
    path = str(tmp_path / 'upernet.onnx')
    export = deployment.export_end2end(cfg, None, path, (96, 96))
    assert export.task == 'segmentation' and export.output_names == ('output', )
    rows = deployment.compare_end2end(export, deployment.random_images(1), [(96, 96), (128, 128),
                                                                            (75, 110)])
    assert [r.agreement for r in rows] == [1., 1., 1.], rows
