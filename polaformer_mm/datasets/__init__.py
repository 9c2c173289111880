"""Datasets: a deterministic synthetic shapes dataset for quick detection/segmentation runs.

Nothing here imports mmdet or mmseg; the files load with their stock ``CocoDataset``,
``BaseSegDataset`` and (in Cityscapes' layout) ``CityscapesDataset`` (see
:mod:`polaformer_mm.datasets.synthetic`).
"""
from .synthetic import (SYNTHETIC_CITYSCAPES_TRAIN_IDS, SYNTHETIC_CLASSES, SYNTHETIC_DEFAULTS,
                        SYNTHETIC_GENERATOR_VERSION, SYNTHETIC_PALETTE, SYNTHETIC_SEG_CLASSES,
                        SYNTHETIC_SEG_PALETTE, generate_synthetic_dataset, write_cityscapes_layout)

__all__ = [
    'SYNTHETIC_CLASSES', 'SYNTHETIC_PALETTE', 'SYNTHETIC_SEG_CLASSES', 'SYNTHETIC_SEG_PALETTE',
    'SYNTHETIC_DEFAULTS', 'SYNTHETIC_GENERATOR_VERSION', 'generate_synthetic_dataset',
    'SYNTHETIC_CITYSCAPES_TRAIN_IDS', 'write_cityscapes_layout'
]
