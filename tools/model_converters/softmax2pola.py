#!/usr/bin/env python
"""Warm-start a Pola backbone from a softmax checkpoint and save it.

    python tools/model_converters/softmax2pola.py SRC DST --config CONFIG
    python tools/model_converters/softmax2pola.py SRC DST --backbone PolaPVT --arch tiny

SRC: a softmax checkpoint of the backbone's family (PVT v1, Swin, PVTv2, DeiT) in the
official release layout or mmdet's / mmpretrain's, bare or a whole model
(``--prefix``, by default ``backbone.`` when present). The Pola backbone comes from
CONFIG's ``model.backbone`` (arch and attn_types included) or from ``--backbone``
and ``--arch``. Every tensor with the same meaning is loaded, the Pola-only tensors
are initialised as a fresh model's (``--seed``); the report says which is which. DST:
``{'state_dict': backbone.*, 'meta'}``, which loads strictly through
``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from polaformer_mm.models.warm_start import convert_softmax_checkpoint  # noqa: E402
from polaformer_mm.models.warm_start.convert import backbone_cfg_of  # noqa: E402
from polaformer_mm.utils.checkpoint_io import CheckpointError  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='softmax checkpoint')
    parser.add_argument('dst', help='output file (not a directory)')
    parser.add_argument('--config', help="a Pola config: its model.backbone is warm-started")
    parser.add_argument('--backbone', help='a Pola backbone type (PolaPVT, PolaSwin, ...)')
    parser.add_argument('--arch', help="the backbone's arch (replaces the config's)")
    parser.add_argument('--attn-types', help="the backbone's attn_types (replaces the config's)")
    parser.add_argument(
        '--prefix', help="the backbone's key prefix in SRC (default: "
        "'backbone.' when present)")
    parser.add_argument(
        '--seed', type=int, default=0, help='seed of the Pola-only tensors (default: 0)')
    parser.add_argument('--verbose', action='store_true', help='also print one line per tensor')
    return parser, parser.parse_args(argv)


def main(argv=None):
    parser, args = parse_args(argv)
    try:
        cfg = backbone_cfg_of(args.config, args.backbone, args.arch, args.attn_types)
        report, state_dict = convert_softmax_checkpoint(cfg, args.src, args.dst, args.prefix,
                                                        args.seed)
    except (OSError, CheckpointError, KeyError, TypeError, ValueError) as err:
        # a named problem of the input: one line, no traceback
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        parser.exit(1, f'softmax2pola: error: {message}\n')
    print(report.format(limit=4))
    if args.verbose:
        print(report.details())
    print(f'wrote {args.dst}: {len(state_dict)} tensors')


if __name__ == '__main__':
    main()
