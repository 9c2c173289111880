#!/usr/bin/env python
"""Parameters and FLOPs of the models of one or more configs, as a table.

    python tools/analysis_tools/get_flops.py CONFIG [CONFIG ...] [--shape H [W]]
        [--backbone-only | --whole-model] [--threads N] [--cfg-options k=v ...]

By default only the backbone is measured (``--backbone-only``), on one 3 x H x W image:
800 x 1333 for mmdet configs, 512 x 512 for mmseg, 224 x 224 for mmpretrain (``--shape``
sets one size for all; a single value means a square). ``--whole-model`` measures
what a tensor-only forward covers: the classifier up to its logits (mmpretrain), the
segmentor up to the decode head's logits, without the training-only auxiliary head
(mmseg), and backbone + neck (mmdet: the cost of detection heads depends on the
proposals and is not counted). The params column counts the measured part (mmseg:
the whole segmentor, auxiliary head included).

Counting is mmengine's ``get_model_complexity_info`` (jit trace): one multiply-add is
one FLOP for convolutions, linear layers and matrix products (the convention of the
PVT, Swin and PolaFormer papers), plus mmengine's norm / upsampling counters.
Elementwise operations (powers, activations, softmax, sums) are not counted. The
polarity-aware attention is ``torch.matmul`` (counted by default); this tool also
registers counters for ``aten::scaled_dot_product_attention`` (Pola-PVT 'S' stages),
``aten::baddbmm``, bicubic upsampling (the resized Pola positional encodings) and 1-D
linear upsampling (Pola values stretched when keys are spatially reduced), and
prints any other non-elementwise operator the trace met but could not count.

Backbones with the same settings at the same size are measured once. Pretrained
weights are never loaded. The counting is ``polaformer_mm.analysis.flops``'s. Examples:

    python tools/analysis_tools/get_flops.py configs/pola_pvt/mask-rcnn_*_fpn_1x_coco.py
    python tools/analysis_tools/get_flops.py CONFIG --shape 800 1280 --threads 1
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
from mmengine.config import DictAction  # noqa: E402

from polaformer_mm.analysis.flops import format_table, measure_configs  # noqa: E402


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        description='Parameters and FLOPs of the backbone (or model) of configs')
    p.add_argument('configs', nargs='+', metavar='CONFIG', help='config file(s)')
    p.add_argument(
        '--shape',
        type=int,
        nargs='+',
        metavar='SIZE',
        help='input H W (or one value for a square); default per config: '
        '800x1333 mmdet, 512x512 mmseg, 224x224 mmpretrain')
    part = p.add_mutually_exclusive_group()
    part.add_argument(
        '--backbone-only', action='store_true', help='measure the backbone only (the default)')
    part.add_argument(
        '--whole-model',
        action='store_true',
        help='measure the tensor-only forward of the model (mmdet: '
        'backbone + neck)')
    p.add_argument(
        '--threads',
        type=int,
        default=None,
        help='torch CPU threads (1 avoids OpenMP stalls on a busy machine)')
    p.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config keys, e.g. model.backbone.attn_types=LLSS')
    args = p.parse_args(argv)
    if args.shape is not None:
        if len(args.shape) not in (1, 2):
            p.error('--shape takes H W or one size')
        if min(args.shape) < 1:
            p.error(f'--shape {" ".join(map(str, args.shape))}: sizes must be positive '
                    'pixel counts (H W, or one size for a square)')
        args.shape = tuple(args.shape * 2 if len(args.shape) == 1 else args.shape)
    return args


def main(argv=None):
    """Measure the configs and print the table."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = measure_configs(args.configs, args.shape, args.whole_model, args.cfg_options)
    print(format_table(rows))


if __name__ == '__main__':
    main()
