from setuptools import find_packages, setup

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
    python_requires='>=3.9',
    install_requires=[
        'torch>=2.0',
        'torchvision',
        'numpy>=1.23,<2.4',  # 2.4 removed np.in1d (mmpretrain metrics)
        'mmengine>=0.10.0,<1.0',
        'mmcv>=2.0.0,<2.2.0',  # mmdet 3.x / mmseg 1.x upper bound
        'mmdet>=3.0.0,<3.4.0',
        'mmsegmentation>=1.0.0,<1.3.0',
        'mmpretrain>=1.0.0,<1.3.0',
        'pycocotools',
        'ftfy',
        'regex',
    ],
    extras_require={
        'tests': ['pytest'],
        'triton': ['triton>=3.0'],  # the fused CUDA kernels of the attention op
    },
    license='Apache-2.0',
    zip_safe=False,
)
