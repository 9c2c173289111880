"""model-index.yml and the configs' metafiles: they parse, name existing configs, cover
every config, carry the measured backbone sizes; and after a plain ``pip install`` of
the package, ``mim search polaformer_mm`` lists every model."""
import glob
import os
import os.path as osp
import re
import shutil
import subprocess
import sys

import pytest
import torch
from modelindex.load_model_index import load

from tests import REPO

ZOO_FOLDERS = ('pola_pvt', 'pola_swin', 'pola_pvtv2', 'pola_vit', 'imagenet')


def _index():
    return load(osp.join(REPO, 'model-index.yml'))


def _zoo_configs():
    return sorted(
        osp.relpath(p, REPO) for folder in ZOO_FOLDERS
        for p in glob.glob(osp.join(REPO, 'configs', folder, '*.py')))


def test_model_index_imports_every_zoo_metafile():
    with open(osp.join(REPO, 'model-index.yml')) as f:
        imported = re.findall(r'^\s*-\s*(\S+)', f.read(), re.M)
    assert imported == [f'configs/{folder}/metafile.yml' for folder in ZOO_FOLDERS]
    for path in imported:
        assert osp.isfile(osp.join(REPO, path)), path


def test_metafiles_name_existing_configs_once_each():
    index = _index()
    collections = {c.name: c for c in index.collections}
    names = [m.name for m in index.models]
    assert len(names) == len(set(names)), 'duplicate model names'
    configs = []
    for model in index.models:
        assert osp.isfile(osp.join(REPO, model.config)), f'{model.name}: {model.config}'
        assert osp.splitext(osp.basename(model.config))[0] == model.name
        assert model.in_collection in collections, model.name
        readme = collections[model.in_collection].readme
        assert osp.isfile(osp.join(REPO, readme)), readme
        configs.append(model.config)
    assert sorted(configs) == _zoo_configs()  # every config of the zoo, no other


def test_results_only_where_published():
    """No weights exist yet for any config: a Result may only be a published ImageNet
    top-1 of an evaluation config, and no model lists Weights."""
    published = {
        'pola-pvt-tiny_8xb128_in1k': 78.8,
        'pola-pvt-small_8xb128_in1k': 81.9,
        'pola-swin-tiny_8xb128_in1k': 82.6,
        'pola-swin-small_8xb128_in1k': 83.6,
        'pola-swin-base_8xb128_in1k': 83.8
    }
    found = {}
    for model in _index().models:
        assert not getattr(model, 'weights', None), model.name
        for result in model.results or []:
            found[model.name] = result.metrics['Top 1 Accuracy']
    assert found == published


ARCHS = {'T': 'tiny', 'S': 'small', 'M': 'medium', 'L': 'large', 'B': 'base'}


def _backbone_cfg(kind, size, imagenet):
    """The backbone of a metafile entry as its configs build it (dense configs return
    all four stages or, for the ViT, blocks 2/5/8/11 of a 512x512 model; ImageNet ones
    the last stage or the class token)."""
    if kind == 'Pola-DeiT':
        vit = dict(type='PolaViT', arch=f'deit-{ARCHS[size]}')
        if imagenet:
            return dict(vit, img_size=224, final_norm=True)
        return dict(vit, img_size=512, final_norm=False, out_indices=(2, 5, 8, 11))
    arch = size.lower() if kind == 'Pola-PVTv2' else ARCHS[size]
    out_indices = (3, ) if imagenet else (0, 1, 2, 3)
    return dict(type=kind.replace('-', ''), arch=arch, out_indices=out_indices)


def test_pola_backbone_params_match_the_code():
    """Backbone MParams of every Pola entry equal the parameter count of that backbone
    as the code builds it (dense configs return all four stages, ImageNet ones the last)."""
    from mmengine.registry import MODELS

    import polaformer_mm  # noqa: F401

    measured = {}
    for model in _index().models:
        data = model.metadata.data
        kind, size = data['Backbone'].rsplit('-', 1)  # e.g. Pola-PVT, T
        if not kind.startswith('Pola-'):
            continue  # softmax baselines: upstream modules
        assert f'{kind[5:].lower()}-{size.lower()}' in model.name.replace('-tiny', '-t')\
            .replace('-small', '-s').replace('-medium', '-m').replace('-large', '-l')\
            .replace('-base', '-b'), model.name
        key = (kind, size, data['Training Data'] == 'ImageNet-1k')
        if key not in measured:
            # shapes only: parameters on the meta device (no memory, no random init)
            with torch.device('meta'):
                backbone = MODELS.build(_backbone_cfg(*key))
            measured[key] = sum(p.numel() for p in backbone.parameters()) / 1e6
        assert measured[key] == pytest.approx(data['Backbone MParams'], abs=0.006), \
            model.name
    # PVT T/S/M/L, Swin T/S/B and PVTv2 B0/B1/B2, dense and ImageNet; PVTv2 B3/B4/B5 dense;
    # DeiT S/B dense, T/S/B ImageNet
    assert len(measured) == 28


def _package_copy(dst):
    """The files a user's ``pip install .`` sees (tracked and new files, no tests)."""
    files = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard'],
                           cwd=REPO,
                           capture_output=True,
                           text=True,
                           check=True).stdout.split('\n')
    for rel in files:
        if not rel or rel.startswith('tests/') or not osp.isfile(osp.join(REPO, rel)):
            continue
        os.makedirs(osp.join(dst, osp.dirname(rel)), exist_ok=True)
        shutil.copy2(osp.join(REPO, rel), osp.join(dst, rel))


def _mim():
    mim = osp.join(osp.dirname(sys.executable), 'mim')
    if not osp.isfile(mim):
        pytest.fail(f'no mim next to {sys.executable}: install requirements/mim.txt '
                    '(pip install --no-deps -r requirements/mim.txt)')
    return mim


def _check_search_output(proc):
    """Every zoo config is listed, with its metadata."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    listed = re.findall(r'config id: (\S+)', re.sub(r'\x1b\[[0-9;]*m', '', proc.stdout))
    expected = [osp.splitext(osp.basename(c))[0] for c in _zoo_configs()]
    assert sorted(listed) == sorted(expected)
    # and with their metadata, e.g. the measured backbone size of Pola-PVT-T on COCO
    block = proc.stdout.split('config id: mask-rcnn_pola-pvt-t_fpn_1x_coco')[1]
    block = block.split('config id:')[0]
    assert re.search(r'backbone_mparams\s+12\.41', block)
    assert re.search(r'backbone_gflops\s+48\.68', block)


@pytest.mark.slow
def test_mim_search_lists_every_model_after_pip_install(tmp_path):
    mim = _mim()
    src, target = tmp_path / 'src', tmp_path / 'site'
    _package_copy(src)
    subprocess.run([
        sys.executable, '-m', 'pip', 'install', '--no-deps', '--no-build-isolation', '--no-compile',
        '-q', '--target',
        str(target),
        str(src)
    ],
                   check=True)
    assert (target / 'polaformer_mm' / '.mim' / 'model-index.yml').is_file()

    env = dict(os.environ, PYTHONPATH=str(target))
    _check_search_output(
        subprocess.run([mim, 'search', 'polaformer_mm'],
                       capture_output=True,
                       text=True,
                       env=env,
                       cwd=tmp_path))


@pytest.mark.slow
def test_mim_search_in_the_project_environment(tmp_path):
    """`make install` installs the package as users do, so `mim search` works in the venv."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    _check_search_output(
        subprocess.run([_mim(), 'search', 'polaformer_mm'],
                       capture_output=True,
                       text=True,
                       env=env,
                       cwd=tmp_path))
