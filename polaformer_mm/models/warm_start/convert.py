"""A softmax checkpoint turned into a Pola backbone checkpoint, once, on disk (the
logic of ``tools/model_converters/softmax2pola.py``)."""
import copy
import os
import os.path as osp
from collections import OrderedDict
from typing import Optional, Tuple

import torch

from ...utils.checkpoint_io import atomic_save
from ...utils.output_paths import OutputPathError, check_output_file
from ...version import __version__
from ..backbones.base import PolaBackboneBase
from ..family import families
from ..official_weights import refuse_same_file
from .core import backbone_family, describe, warm_start
from .report import WarmStartReport


def backbone_cfg_of(config: Optional[str] = None,
                    backbone: Optional[str] = None,
                    arch: Optional[str] = None,
                    attn_types: Optional[str] = None) -> dict:
    """The Pola backbone config: ``model.backbone`` of ``config`` (a path), or
    ``dict(type=backbone)``; ``arch`` / ``attn_types`` replace the config's."""
    if (config is None) == (backbone is None):
        raise ValueError('give a Pola config or a backbone type (e.g. PolaPVT), not both')
    if config is not None:
        from mmengine.config import Config
        model = Config.fromfile(config).get('model', {})
        if not isinstance(model, dict) or 'backbone' not in model:
            raise KeyError(f'config {config!r} has no model.backbone')
        backbone_cfg = model['backbone']
        to_dict = getattr(backbone_cfg, 'to_dict', None)
        cfg = copy.deepcopy(to_dict() if to_dict else dict(backbone_cfg))
    else:
        cfg = dict(type=backbone)
    if arch is not None:
        cfg['arch'] = arch
    if attn_types is not None:
        cfg['attn_types'] = attn_types
    for key in ('init_cfg', 'pretrained', '_delete_'):
        cfg.pop(key, None)
    return cfg


def build_backbone(cfg: dict) -> PolaBackboneBase:
    """Build a Pola backbone from its config (a named error for any other type)."""
    from mmengine.registry import MODELS
    cls = MODELS.get(cfg.get('type')) if isinstance(cfg.get('type'), str) else cfg.get('type')
    if not (isinstance(cls, type) and issubclass(cls, PolaBackboneBase)):
        known = ', '.join(family.backbone.__name__ for family in families())
        raise TypeError(f'{cfg.get("type")!r} is not a Pola backbone; the warm start builds '
                        f'{known}')
    module = MODELS.build(dict(cfg))
    backbone_family(module)
    return module


def convert_softmax_checkpoint(backbone_cfg: dict,
                               src: str,
                               dst: str,
                               prefix: Optional[str] = None,
                               seed: int = 0) -> Tuple[WarmStartReport, dict]:
    """Warm-start the Pola backbone of ``backbone_cfg`` from the softmax file ``src``
    and write it to ``dst`` as ``{'state_dict': backbone.*, 'meta'}``, the format of
    ``official2mm.py``: it loads strictly through ``init_cfg=dict(type='Pretrained',
    checkpoint=dst, prefix='backbone.')`` into a backbone of the same config.

    Args:
        backbone_cfg (dict): The Pola backbone (``type``, ``arch``, ``attn_types``, ...).
        src (str): The softmax checkpoint.
        dst (str): The output file (written atomically; never ``src``, nor a folder).
        prefix (str, optional): The prefix of the backbone's keys in ``src``.
        seed (int): The seed of the fresh initialisation of the Pola-only tensors.
            Default: 0.

    Returns:
        tuple: the report and the written state dict.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    refuse_same_file(src, dst)
    if osp.isdir(osp.expanduser(dst)):
        raise ValueError(f'DST {dst!r} is an existing directory: give the path of the file '
                         f'to write, e.g. {osp.join(dst, "warm_start.pth")!r}')
    check_destination(dst)
    torch.manual_seed(seed)
    backbone = build_backbone(backbone_cfg)
    report = warm_start(backbone, src, prefix=prefix, log=False)
    state_dict = OrderedDict(('backbone.' + k, v) for k, v in backbone.state_dict().items())
    meta = dict(
        source=osp.basename(src),
        backbone=describe(backbone),
        layout=report.layout,
        warm_start=report.summary(),
        seed=seed,
        converted_by=f'polaformer_mm {__version__}')
    try:
        atomic_save(dict(state_dict=state_dict, meta=meta), dst)
    except OSError as err:  # the folder changed since the check, the disk is full, ...
        raise OutputPathError(f'DST {dst}: could not be written ({type(err).__name__}: '
                              f'{err.strerror or err})') from None
    return report, state_dict


def check_destination(dst: str) -> None:
    """Check, before any work, that the file ``dst`` can be written: its folder is made
    if missing and takes a new file (:class:`~polaformer_mm.utils.output_paths.
    OutputPathError` naming DST and the reason otherwise)."""
    folder = osp.dirname(osp.abspath(osp.expanduser(dst)))
    if not osp.isdir(folder):
        above = folder
        while not osp.exists(above) and osp.dirname(above) != above:
            above = osp.dirname(above)
        if not osp.isdir(above):
            raise OutputPathError(f'DST {dst}: {above} is a file, not a folder')
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as err:
            raise OutputPathError(f'DST {dst}: its folder {folder} cannot be made '
                                  f'({type(err).__name__}: {err.strerror or err})') from None
    check_output_file('DST', osp.expanduser(dst))
