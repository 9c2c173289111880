import os
import os.path as osp
import shutil
import sys
from setuptools import find_packages, setup

# What OpenMMLab's `mim` reads from an installed package's `.mim` folder: the model index
# (`mim search polaformer_mm`), the configs it names, and the tools (`mim train` / `mim test`).
MIM_ITEMS = ('model-index.yml', 'configs', 'tools')


def add_mim_extension():
    """Put ``MIM_ITEMS`` under ``polaformer_mm/.mim``, as OpenMMLab packages do.

    Symlinks when building an editable install (``pip install -e .``, so edits stay
    live), copies when building a wheel or an sdist (``pip install .``). Items missing
    from the tree (a build from an sdist, which already holds the copies) are left as
    they are.
    """
    if 'develop' in sys.argv or 'editable_wheel' in sys.argv:
        mode = 'copy' if os.name == 'nt' else 'symlink'
    elif any(cmd in sys.argv for cmd in ('bdist_wheel', 'sdist', 'build', 'build_py')):
        mode = 'copy'
    else:
        return
    repo = osp.dirname(osp.abspath(__file__))
    mim_dir = osp.join(repo, 'polaformer_mm', '.mim')
    os.makedirs(mim_dir, exist_ok=True)
    for item in MIM_ITEMS:
        src, dst = osp.join(repo, item), osp.join(mim_dir, item)
        if not osp.exists(src):
            continue
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if mode == 'symlink':
            os.symlink(osp.relpath(src, mim_dir), dst)
        elif osp.isdir(src):
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        else:
            shutil.copyfile(src, dst)


add_mim_extension()

with open('polaformer_mm/version.py') as f:
    exec(f.read())  # defines __version__

with open('README.md', encoding='utf-8') as f:
    long_description = f.read()

setup(
    name='polaformer_mm',
    version=__version__,  # noqa: F821
    description='PolaFormer (polarity-aware linear attention) backbones for '
    'MMDetection, MMSegmentation and MMPretrain',
    long_description=long_description,
    long_description_content_type='text/markdown',
    packages=find_packages(include=['polaformer_mm', 'polaformer_mm.*']),
    package_data={
        'polaformer_mm': [
            '.mim/model-index.yml', '.mim/configs/**/*.py', '.mim/configs/**/*.yml',
            '.mim/configs/**/*.md', '.mim/tools/**/*.py', '.mim/tools/**/*.sh'
        ]
    },
    # The supported range: from the low test stack (requirements/oldest.txt) to the pinned
    # one (requirements/runtime.txt); `make test` and `make test STACK=oldest` test both ends.
    python_requires='>=3.9,<3.13',
    install_requires=[
        'torch>=2.1,<2.14',  # mmcv 2.1.0 does not compile against torch 2.14
        'torchvision>=0.16,<0.29',
        'numpy>=1.24,<2.4',  # 2.4 removed np.in1d (mmpretrain metrics)
        'mmengine>=0.10.3,<0.11',
        'mmcv>=2.1.0,<2.2.0',  # mmdet 3.3 / mmseg 1.2 upper bound
        'mmdet>=3.3.0,<3.4.0',
        'mmsegmentation>=1.2.2,<1.3.0',
        'mmpretrain>=1.2.0,<1.3.0',
        'pycocotools',
        'ftfy',
        'regex',
    ],
    extras_require={
        'tests': ['pytest'],
        'triton': ['triton>=2.1'],  # the fused CUDA kernels of the attention op
    },
    license='Apache-2.0',
    zip_safe=False,
)
