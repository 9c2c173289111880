"""The install guard: how .dev_scripts/build_mmcv_wheel.sh builds mmcv's ops for the torch at
hand (CUDA ops for a CUDA torch, a stop with the fix where nvcc is missing), and the
run-time check that stops a model on CUDA whose mmcv has no CUDA ops."""
import os
import os.path as osp
import stat
import subprocess
import sys

import pytest
import torch

from polaformer_mm.utils.mmcv_ops import (CPU_ONLY_ENV, MmcvCudaOpsError, check_mmcv_cuda_ops,
                                          mmcv_cuda_ops_version, uses_mmcv_ops)
from .. import REPO
from .._tools import load_tool

SCRIPT = osp.join(REPO, '.dev_scripts', 'build_mmcv_wheel.sh')
HELPER = osp.join(REPO, '.dev_scripts', 'mmcv_build_plan.py')

# the maintainers' script, loaded by its path (it is no part of the package)
build_plan = load_tool('mmcv_build_plan.py', folder='.dev_scripts')
MmcvBuildError = build_plan.MmcvBuildError
arch_list_from_capabilities = build_plan.arch_list_from_capabilities
plan_mmcv_build = build_plan.plan_mmcv_build


def test_cpu_torch_builds_cpu_ops():
    plan = plan_mmcv_build(None, None, [], {})
    assert (plan.tag, plan.force_cuda, plan.cuda_arch_list, plan.hide_gpus) == \
        ('cpu', False, None, False)


def test_cuda_torch_without_nvcc_stops_with_the_fix():
    with pytest.raises(MmcvBuildError) as exc:
        plan_mmcv_build('12.8', None, [(9, 0)], {})
    msg = str(exc.value)
    assert 'torch is a CUDA 12.8 build but no nvcc was found' in msg
    assert 'install the CUDA toolkit 12.8' in msg
    assert f'{CPU_ONLY_ENV}=1' in msg


def test_cpu_only_opt_in_hides_the_gpus():
    plan = plan_mmcv_build('12.8', None, [(9, 0)], {CPU_ONLY_ENV: '1'})
    assert (plan.tag, plan.force_cuda, plan.hide_gpus) == ('cu128-cpuops', False, True)
    # nothing to hide without a GPU; '0' is no opt-in
    assert not plan_mmcv_build('12.8', None, [], {CPU_ONLY_ENV: 'yes'}).hide_gpus
    with pytest.raises(MmcvBuildError):
        plan_mmcv_build('12.8', None, [], {CPU_ONLY_ENV: '0'})


def test_cuda_ops_for_the_visible_gpus():
    plan = plan_mmcv_build('12.8', '12.8', [(9, 0), (8, 0), (9, 0)], {})
    assert plan.force_cuda and not plan.hide_gpus
    assert plan.cuda_arch_list == '8.0;9.0+PTX'
    assert plan.tag == 'cu128-sm80_90'  # the wheel cache tells GPU archs apart
    # a newer GPU than torch supports is clamped, as torch's extension builder does
    assert arch_list_from_capabilities([(12, 0)], max_supported=(9, 0)) == '9.0+PTX'
    # a minor nvcc / torch difference compiles (torch only warns)
    assert plan_mmcv_build('12.8', '12.4', [(8, 6)], {}).cuda_arch_list == '8.6+PTX'


def test_arch_list_from_the_environment_wins():
    plan = plan_mmcv_build('12.1', '12.1', [(8, 6)], {'TORCH_CUDA_ARCH_LIST': '7.0;8.0'})
    assert plan.cuda_arch_list == '7.0;8.0' and plan.tag == 'cu121-sm70_80'
    plan = plan_mmcv_build('12.1', '12.1', [], {'TORCH_CUDA_ARCH_LIST': '9.0'})
    assert plan.force_cuda and plan.cuda_arch_list == '9.0'


def test_no_gpu_and_no_arch_list_is_an_error():
    with pytest.raises(MmcvBuildError, match='TORCH_CUDA_ARCH_LIST'):
        plan_mmcv_build('12.8', '12.8', [], {})


def test_nvcc_of_another_major_version_is_an_error():
    with pytest.raises(
            MmcvBuildError,
            match=r'nvcc is CUDA 11.8 but torch was built for '
            r'CUDA 12.8.*install the CUDA toolkit 12.8'):
        plan_mmcv_build('12.8', '11.8', [(8, 0)], {})


def test_build_script_finds_the_cached_wheel(tmp_path):
    """This machine's torch through the real script: the plan and the cache key."""
    torch_v = torch.__version__.split('+')[0]
    tag = 'cpu' if not torch.version.cuda else None
    if tag is None:
        pytest.skip('the cache key of a CUDA torch depends on the GPUs')
    py = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    dest = tmp_path / f'mmcv-2.1.0-torch{torch_v}-{py}-{tag}'
    dest.mkdir()
    (dest / 'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl').write_bytes(b'')
    proc = subprocess.run(['bash', SCRIPT, sys.executable],
                          capture_output=True,
                          text=True,
                          env=dict(os.environ, POLA_WHEEL_CACHE=str(tmp_path)),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(dest)
    assert 'mmcv ops: torch is a CPU build: CPU ops' in proc.stderr


def test_build_script_stops_with_the_message(tmp_path):
    """The script's handling of a 'no' from the helper: it stops before building and
    shows the message. The interpreter given to it runs the real helper with the probe
    answering 'CUDA 12.8 torch, a GPU, no nvcc' (no CUDA torch is installed here)."""
    fake = tmp_path / 'python'
    fake.write_text(f'''#!/bin/bash
if [[ "$1" == */.dev_scripts/mmcv_build_plan.py ]]; then
  exec {sys.executable} - <<'EOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location('mmcv_build_plan', {HELPER!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
m.probe_build_environment = lambda: dict(
    torch_version='2.13.0', torch_cuda='12.8', nvcc_version=None, gpu_capabilities=[(9, 0)],
    max_supported=(9, 0))
sys.exit(m.main())
EOF
fi
exec {sys.executable} "$@"
''')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    proc = subprocess.run(['bash', SCRIPT, str(fake)],
                          capture_output=True,
                          text=True,
                          env=dict(os.environ, POLA_WHEEL_CACHE=str(tmp_path / 'cache')),
                          timeout=120)
    assert proc.returncode == 1
    assert 'no nvcc was found' in proc.stderr and f'{CPU_ONLY_ENV}=1' in proc.stderr
    assert proc.stdout == '' and not (tmp_path / 'cache').exists()


def test_mmcv_ops_of_this_install():
    ops, cuda, error = mmcv_cuda_ops_version()
    assert ops and error is None  # the tested stack compiles mmcv's ops
    if not torch.version.cuda:
        assert cuda is None  # a CPU torch gets CPU ops


@pytest.fixture(scope='module')
def retinanet():
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    cfg = Config.fromfile(osp.join(REPO, 'configs/pola_pvt/retinanet_pola-pvt-t_fpn_1x_coco.py'))
    cfg.model.backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope('mmdet'):
        return MODELS.build(cfg.model)


def test_model_on_cuda_without_mmcv_cuda_ops_stops(retinanet):
    assert uses_mmcv_ops(retinanet)
    cpu_only = (True, None, None)
    with pytest.raises(MmcvCudaOpsError) as exc:
        check_mmcv_cuda_ops(retinanet, env={}, status=cpu_only, on_cuda=True)
    msg = str(exc.value)
    assert 'RetinaNet' in msg and 'built without CUDA ops' in msg
    assert 'install the CUDA toolkit' in msg and f'{CPU_ONLY_ENV}=1' in msg
    # the opt-in turns the stop into a warning; CPU models and CUDA ops pass
    with pytest.warns(RuntimeWarning, match='built without CUDA ops'):
        check_mmcv_cuda_ops(retinanet, env={CPU_ONLY_ENV: '1'}, status=cpu_only, on_cuda=True)
    check_mmcv_cuda_ops(retinanet, env={}, status=cpu_only, on_cuda=False)
    check_mmcv_cuda_ops(retinanet, env={}, status=(True, '12.8', None), on_cuda=True)
    # an mmcv whose compiled ops do not load at all: no opt-in helps
    with pytest.raises(MmcvCudaOpsError, match='compiled ops do not load'):
        check_mmcv_cuda_ops(
            retinanet,
            env={CPU_ONLY_ENV: '1'},
            status=(False, None, 'ModuleNotFoundError: mmcv._ext'),
            on_cuda=True)
    # on this machine the model is on the CPU: nothing to check
    check_mmcv_cuda_ops(retinanet)


def test_a_backbone_alone_needs_no_mmcv_ops(retinanet):
    assert not uses_mmcv_ops(retinanet.backbone)
    check_mmcv_cuda_ops(retinanet.backbone, env={}, status=(True, None, None), on_cuda=True)
