#!/usr/bin/env python
"""Convert an official PolaFormer checkpoint (Pola-PVT or Pola-Swin) for OpenMMLab.

    python tools/model_converters/official2mm.py SRC DST

SRC: an official file (a bare state dict, or ``{'model': ...}``, possibly with a pickled
yacs config; yacs need not be installed). DST: ``{'state_dict': ..., 'meta': ...}`` with
``backbone.*`` keys and the classifier as ``head.fc.*``. It loads with ``strict=True`` into
an mmpretrain ImageClassifier (backbone with ``out_indices=(3,)``, GlobalAveragePooling,
LinearClsHead), and into detectors / segmentors through
``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from polaformer_mm.models.official_weights import convert_official_checkpoint  # noqa: E402
from polaformer_mm.utils.checkpoint_io import CheckpointError  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='official PolaFormer checkpoint')
    parser.add_argument('dst', help='output file of the converted checkpoint (not a directory)')
    args = parser.parse_args(argv)
    try:
        state_dict = convert_official_checkpoint(args.src, args.dst)
    except (OSError, CheckpointError, KeyError, ValueError) as err:
        # a named problem of the input (or of DST's folder: not writable, a file, ...):
        # one line, no traceback
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        parser.exit(1, f'official2mm: error: {message}\n')
    num_params = sum(v.numel() for k, v in state_dict.items())
    print(f'wrote {args.dst}: {len(state_dict)} tensors, '
          f'{num_params / 1e6:.2f} M values')


if __name__ == '__main__':
    main()
