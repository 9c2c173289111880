"""Parameters and FLOPs of a config's backbone (or model), counted with mmengine's
``get_model_complexity_info`` (a jit trace), for ``tools/analysis_tools/get_flops.py`` and
the gain table.

One multiply-add is one FLOP for convolutions, linear layers and matrix products (the
convention of the PVT, Swin and PolaFormer papers), plus mmengine's norm / upsampling
counters; elementwise operations are not counted. :func:`register_extra_flop_ops` adds
counters for the operators of the Pola backbones that mmengine lacks (the attention op,
``aten::scaled_dot_product_attention``, ``aten::baddbmm``, bicubic and 1-D linear
upsampling); :func:`measure` reports any other non-elementwise operator the trace met but
could not count.
"""
import importlib
import json
import logging
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.analysis import complexity_analysis, get_model_complexity_info
from mmengine.analysis.jit_handles import bmm_flop_jit, elementwise_flop_counter, get_shape
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.registry import DefaultScope

#: the input size (H, W) of each scope's configs
DEFAULT_SHAPES = {'mmdet': (800, 1333), 'mmseg': (512, 512), 'mmpretrain': (224, 224)}
#: datasets whose configs are measured at another size than their scope's: Cityscapes at
#: its whole-image evaluation size
DATASET_SHAPES = {'CityscapesDataset': (1024, 2048)}

# Not counted by convention (elementwise, reductions, data movement). Any other operator
# the trace meets without a counter is reported under the table.
ELEMENTWISE_OPS = {
    'aten::' + name
    for name in ('abs add add_ div div_ exp gelu mean mul mul_ neg pow reciprocal rsub '
                 'sigmoid silu softmax softplus sqrt sub sum where fill_ ne __or__ '
                 '__and__ lt le bitwise_or im2col col2im pad unflatten clone '
                 'log_softmax tanh hardtanh erf lift_fresh any all argmax '
                 'feature_dropout max_pool2d avg_pool2d sort topk repeat index_select '
                 'masked_fill masked_fill_ log clamp_min sign relu max remainder arange '
                 'minimum gt ge eq floor_divide eye ones_like').split()
}


def sdpa_flop_jit(inputs, outputs):
    """q (..., N, d) k (..., n, d) v (..., n, dv): N*n*d for q k^T, N*n*dv for the
    weighted sum (multiply-adds), times the batch dims."""
    q, k, v = (get_shape(x) for x in inputs[:3])
    batch = 1
    for size in q[:-2]:
        batch *= size
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def baddbmm_flop_jit(inputs, outputs):
    """baddbmm(input, batch1, batch2, beta, alpha): the product batch1 @ batch2."""
    return bmm_flop_jit(inputs[1:3], outputs)


def pola_attention_flop_jit(inputs, outputs):
    """polaformer_mm's attention op (an autograd Function, traced as one PythonOp):
    q (B, h, N, d), k (B, h, n, d). Its two products, as multiply-adds: the key summary
    [k+, k-]^T v (2d x n times n x d) and [q+, q-] (N x 2d) times the (2d x (d + 2))
    summary."""
    q, k = get_shape(inputs[0]), get_shape(inputs[1])
    *batch, N, d = q
    n = k[-2]
    count = 1
    for size in batch:
        count *= size
    return count * (2 * d * n * d + N * 2 * d * (d + 2))


def resize_flop_counter(per_element: int):
    """mmengine's per-output-element counter of a resize, 0 when the resize keeps the
    size (a trace records the resizes of positional encodings also where the grids
    agree: an identity then, which eager code skips)."""
    count = elementwise_flop_counter(0, per_element)

    def handle(inputs, outputs):
        """0 for a resize to the same size, else mmengine's count."""
        if get_shape(inputs[0])[2:] == get_shape(outputs[0])[2:]:
            return 0
        return count(inputs, outputs)

    return handle


#: Counters that replace mmengine's own.
OVERRIDDEN_FLOP_OPS = {'aten::upsample_bilinear2d': resize_flop_counter(4)}

EXTRA_FLOP_OPS = {
    'prim::PythonOp._PolaAttentionFunction': pola_attention_flop_jit,
    'aten::scaled_dot_product_attention': sdpa_flop_jit,
    'aten::baddbmm': baddbmm_flop_jit,
    'aten::upsample_bicubic2d': resize_flop_counter(16),
    # values stretched to the query length for the local conv when keys are reduced
    'aten::upsample_linear1d': elementwise_flop_counter(0, 2),
}


def register_extra_flop_ops() -> None:
    """Add our counters to the table every mmengine FlopAnalyzer starts from (which
    get_model_complexity_info builds internally); existing entries are kept, but for
    those of ``OVERRIDDEN_FLOP_OPS``."""
    table = complexity_analysis._DEFAULT_SUPPORTED_FLOP_OPS
    for name, handle in EXTRA_FLOP_OPS.items():
        table.setdefault(name, handle)
    table.update(OVERRIDDEN_FLOP_OPS)


class _UnsupportedOps(logging.Handler):
    """Collects the 'Unsupported operator X encountered N time(s)' log records."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.ops = set()

    def emit(self, record):
        """Keep the operator's name of an 'Unsupported operator' record."""
        msg = record.getMessage()
        if msg.startswith('Unsupported operator '):
            self.ops.add(msg.split()[2])


class _TensorForward(nn.Module):
    """Wraps the part of a model that is measured so that forward(image) runs it."""

    def __init__(self, model: nn.Module, scope: str, whole: bool):
        super().__init__()
        self.model = model
        self.scope = scope
        self.whole = whole

    def forward(self, x):
        """The measured part on the image ``x``."""
        if not self.whole:
            return self.model(x)
        if self.scope == 'mmdet':
            return self.model.extract_feat(x)
        return self.model(x, mode='tensor')


def scope_registry(scope: str):
    """The MODELS registry of an OpenMMLab scope (mmdet, mmseg, mmpretrain)."""
    return importlib.import_module(f'{scope}.registry').MODELS


def backbone_key(cfg: Config, whole: bool) -> str:
    """The settings of the measured part (pretrained weights left out), as a key."""
    part = cfg.model.to_dict() if whole else cfg.model.backbone.to_dict()
    part.pop('init_cfg', None)
    part.pop('pretrained', None)
    return json.dumps(part, sort_keys=True, default=repr)


def describe_backbone(cfg: Config) -> str:
    """The backbone of a config in a few words: its type and arch (or depths)."""
    backbone = cfg.model.backbone
    kind = str(backbone.type).split('.')[-1]
    if 'arch' in backbone:
        return f"{kind} {backbone.arch}"
    for key in ('num_layers', 'depths'):
        if key in backbone:
            width = f" C={backbone.embed_dims}" if 'embed_dims' in backbone else ''
            depth = backbone[key]  # per stage, or one int (a single-stage transformer)
            return f'{kind}{width} {list(depth) if isinstance(depth, (list, tuple)) else depth}'
    return kind


def measure(cfg: Config, shape: Tuple[int, int], whole: bool) -> dict:
    """Params and FLOPs of the config's backbone (``whole``: its tensor-only forward) on one
    3 x H x W image, and the operators the trace met but could not count."""
    scope = cfg.get('default_scope')
    if scope not in DEFAULT_SHAPES:
        raise ValueError(f'default_scope {scope!r} is not one of {list(DEFAULT_SHAPES)}')
    registry = scope_registry(scope)
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.build(cfg.model if whole else cfg.model.backbone)
    model.eval()  # some backbones' train() returns None: do not chain
    wrapped = _TensorForward(model, scope, whole).eval()
    # parameters of the measured part (mmdet whole model: backbone + neck)
    counted = ([model.backbone, model.neck]
               if whole and scope == 'mmdet' and model.with_neck else [model])
    params = sum(p.numel() for m in counted for p in m.parameters())

    # the analyzers log every unsupported operator (elementwise ones included) and
    # uncalled module: collect the former instead of printing them
    logger = MMLogger.get_current_instance()
    catcher = _UnsupportedOps()
    handlers, logger.handlers = logger.handlers, [catcher]
    try:
        with torch.no_grad():
            info = get_model_complexity_info(
                wrapped, inputs=(torch.randn(1, 3, *shape), ), show_table=False, show_arch=False)
    finally:
        logger.handlers = handlers
    table = complexity_analysis._DEFAULT_SUPPORTED_FLOP_OPS
    uncounted = sorted(op for op in catcher.ops if op not in table and op not in ELEMENTWISE_OPS)
    return dict(params=params, flops=info['flops'], uncounted=uncounted)


def default_shape(cfg: Config) -> Tuple[int, int]:
    """The size a config is measured at: its test dataset's (:data:`DATASET_SHAPES`), else
    its scope's (:data:`DEFAULT_SHAPES`)."""
    dataset = (cfg.get('test_dataloader') or {}).get('dataset') or {}
    while 'dataset' in dataset:  # wrappers
        dataset = dataset['dataset']
    kind = str(dataset.get('type', '')).split('.')[-1]
    return DATASET_SHAPES.get(kind) or DEFAULT_SHAPES.get(cfg.get('default_scope'))


def _fmt_shape(shape):
    return f'{shape[0]}x{shape[1]}'


def measure_configs(configs: List[str],
                    shape: Optional[Tuple[int, int]],
                    whole: bool,
                    cfg_options: Optional[dict] = None) -> List[dict]:
    """One row per config (:func:`measure` at ``shape``, default :func:`default_shape`):
    backbones with the same settings at the same size are measured once."""
    register_extra_flop_ops()
    rows, cache = [], {}
    for path in configs:
        cfg = Config.fromfile(path)  # imports the config's custom_imports
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
        scope = cfg.get('default_scope')
        size = shape or default_shape(cfg)
        key = (scope, backbone_key(cfg, whole), tuple(size or ()))
        if key not in cache:
            cache[key] = measure(cfg, tuple(size), whole)
        part = ('backbone' if not whole else {'mmdet': 'backbone+neck'}.get(scope, 'model'))
        rows.append(
            dict(
                config=path,
                backbone=describe_backbone(cfg),
                part=part,
                shape=_fmt_shape(size),
                **cache[key]))
    return rows


def format_table(rows: List[dict]) -> str:
    """The rows of :func:`measure_configs` as a Markdown table, the uncounted operators
    under it."""
    lines = [
        '| config | backbone | measured | input (HxW) | params (M) | FLOPs (G) |',
        '|---|---|---|---|---:|---:|'
    ]
    for r in rows:
        lines.append(f"| {r['config']} | {r['backbone']} | {r['part']} | {r['shape']} | "
                     f"{r['params'] / 1e6:.2f} | {r['flops'] / 1e9:.2f} |")
    notes: Dict[str, List[str]] = {}
    for r in rows:
        for op in r['uncounted']:
            notes.setdefault(op, []).append(r['config'])
    for op, paths in notes.items():
        lines.append(f'\nnot counted: {op} (in {len(paths)} config(s), e.g. {paths[0]})')
    return '\n'.join(lines)
