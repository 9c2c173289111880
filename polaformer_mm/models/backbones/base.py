"""What PolaPVT and PolaSwin share: stage freezing, gradient checkpointing,
weight init and loading of official or converted checkpoints."""
from typing import Sequence

import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmengine.runner.checkpoint import load_state_dict
from torch.nn.modules.batchnorm import _BatchNorm


def _freeze(module: nn.Module) -> None:
    module.eval()
    for param in module.parameters():
        param.requires_grad = False


class PolaBackboneBase(BaseModule):
    """Common behaviour of the Pola backbones.

    Subclasses set ``self.kind`` ('pvt' or 'swin') and implement
    ``_frozen_modules()`` returning the modules covered by ``frozen_stages``.
    """

    kind = None

    def _check_indices(self, out_indices: Sequence[int], num_stages: int):
        out_indices = tuple(int(i) for i in out_indices)
        if not out_indices or any(i < 0 or i >= num_stages
                                  for i in out_indices):
            raise ValueError(f'out_indices must name stages in '
                             f'0..{num_stages - 1}, got {out_indices}')
        if not -1 <= self.frozen_stages <= num_stages:
            raise ValueError(f'frozen_stages must be in -1..{num_stages}, '
                             f'got {self.frozen_stages}')
        return out_indices

    def _run_block(self, block: nn.Module, x, hw_shape):
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(block, x, hw_shape, use_reentrant=False)
        return block(x, hw_shape)

    def _frozen_modules(self):
        raise NotImplementedError

    def _freeze_stages(self) -> None:
        for module in self._frozen_modules():
            _freeze(module)

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    def init_weights(self) -> None:
        init_cfg = self.init_cfg
        if isinstance(init_cfg, dict) and init_cfg.get('type') == 'Pretrained':
            # Handled here rather than by mmengine's PretrainedInit so that an
            # official checkpoint (which carries a pickled yacs config and official
            # key names) also works, and is converted on the fly.
            from ..checkpoint import load_backbone_weights
            state_dict = load_backbone_weights(
                init_cfg.get('checkpoint'), kind=self.kind,
                prefix=init_cfg.get('prefix', None))
            load_state_dict(
                self, state_dict, strict=False, logger=MMLogger.get_current_instance())
            self._is_init = True
            return
        if init_cfg is None:
            self._official_init()
            self._is_init = True
            return
        super().init_weights()

    def _official_init(self) -> None:
        """The official scheme: trunc-normal(0.02) linears and position tables,
        unit LayerNorms; the Pola-specific parameters start at zero."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for name, param in self.named_parameters():
            if name.endswith(('pos_embed', 'relative_position_bias_table')):
                trunc_normal_(param, std=.02)
