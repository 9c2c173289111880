"""What the Pola backbones share: argument checks, stage freezing, the forward
over stages, weight init and loading of official or converted checkpoints."""
import inspect
import numbers
import re
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import WEIGHT_INITIALIZERS
from mmengine.utils import to_2tuple
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from ..utils import check_sizes, nlc_to_nchw

#: keys only Pola attention has (official PolaFormer files and ours alike)
POLA_KEYS = r'(^|\.)attn\.(qg|qkvg|power|positional_encoding)(\.|$)'


def is_int(value) -> bool:
    """An integer that is not a bool (``True`` is not a stage index)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_positive_int(name: str, value) -> int:
    """``value`` as an int >= 1, else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive int, got {value!r}')
    return value


def check_probability(name: str, value) -> float:
    """A rate in [0, 1), else a ValueError naming ``name``."""
    if not (isinstance(value, (int, float)) and 0 <= value < 1):
        raise ValueError(f'{name} must be in [0, 1), got {value!r}')
    return float(value)


def check_stage_list(name: str, values, num_stages: int) -> List[int]:
    """One positive int per stage (a list or tuple; digits of a str are accepted
    too), else a ValueError naming ``name``."""
    if isinstance(values, str) and values.isdigit():
        values = [int(c) for c in values]
    if not isinstance(values, (list, tuple)):
        raise ValueError(f'{name} must be a list of {num_stages} positive ints (one '
                         f'per stage), got {values!r}')
    values = list(values)
    if len(values) != num_stages:
        raise ValueError(f'{name} needs {num_stages} values (one per stage), got '
                         f'{values}')
    try:
        return [check_positive_int(f'{name}[{i}]', v) for i, v in enumerate(values)]
    except ValueError:
        raise ValueError(f'{name} must hold positive ints, got {values}') from None


def check_mlp_ratios(mlp_ratios, num_stages: int) -> None:
    """One number > 0 per stage in the arch's ``mlp_ratios`` (a list; not a bool), else
    a ValueError naming the key."""
    if not (isinstance(mlp_ratios, list) and len(mlp_ratios) == num_stages and all(
            isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 for r in mlp_ratios)):
        raise ValueError(f'arch mlp_ratios must be {num_stages} numbers > 0, '
                         f'got {mlp_ratios!r}')


def _freeze(module: nn.Module) -> None:
    module.eval()
    for param in module.parameters():
        param.requires_grad = False


class PolaBackboneBase(BaseModule):
    """Common behaviour of the Pola backbones.

    Subclasses set ``family`` (the name of the family their module registers,
    :mod:`polaformer_mm.models.family`; 'pvt' and 'swin' also name the official
    checkpoints they load), ``arch_zoo``, ``_arch_keys``, ``_arch_defaults`` and
    ``_arch_stage_lists``, check their arguments with :meth:`_check_common_args`, and
    implement ``forward_stages`` (yielding raw stage tokens and their grid) and
    ``_frozen_modules`` (the modules ``frozen_stages`` covers). A single-resolution
    backbone (a plain transformer with a class token) checks its own arguments, uses
    :meth:`_setup_stages` with one "stage" per block, and has its own ``forward``
    (:meth:`_check_images` checks its input).
    """

    family: Optional[str] = None
    arch_zoo: Dict[str, dict] = {}
    _arch_keys: Tuple[str, ...] = ()
    _arch_defaults: dict = {}
    #: arch entries that hold one positive int per stage (``depths`` is always checked)
    _arch_stage_lists: Tuple[str, ...] = ()

    def __new__(cls, *args, **kwargs):
        """Record the constructor's arguments (:meth:`init_args`) before building."""
        self = super().__new__(cls)
        self.__dict__['_init_args'] = (args, dict(kwargs))
        return self

    def init_args(self) -> Dict[str, Any]:
        """The arguments this backbone was built with, by name, defaults included:
        ``type(self)(**self.init_args())`` builds the same backbone (the warm start
        builds its softmax twin so)."""
        args, kwargs = self.__dict__.get('_init_args', ((), {}))
        bound = inspect.signature(type(self)).bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def __init__(self, init_cfg=None, pretrained: Optional[str] = None):
        # mmseg's EncoderDecoder hands the model-level ``pretrained`` to the backbone
        if pretrained is not None:
            if init_cfg is not None:
                raise ValueError(f'{type(self).__name__}: set init_cfg or pretrained, '
                                 'not both')
            warnings.warn(
                'pretrained is deprecated, use init_cfg=dict('
                "type='Pretrained', checkpoint=...)", DeprecationWarning)
            init_cfg = dict(type='Pretrained', checkpoint=pretrained)
        super().__init__(init_cfg=init_cfg)

    def _check_common_args(self, arch: Union[str, dict], attn_types: str, out_indices,
                           frozen_stages: int, norm_eval: bool, with_cp: bool, patch_size: int,
                           in_channels: int, pretrain_img_size,
                           drop_rates: Dict[str, float]) -> Tuple[dict, list]:
        """Check (and store) what both backbones take: the arch and its per-stage lists,
        the per-stage options (:meth:`_setup_stages`), the patch embedding, the dropout
        rates (``drop_rates``: name -> rate) and the pretraining size.

        Returns:
            tuple: the parsed arch (:meth:`_parse_arch`) and the token grid of every
            stage at ``pretrain_img_size`` (:meth:`_stage_grids`).
        """
        arch = self._parse_arch(arch)
        num_stages = len(arch['depths'])
        self._setup_stages(num_stages, attn_types, out_indices, frozen_stages, norm_eval, with_cp)
        for name in self._arch_stage_lists:
            check_stage_list(f'arch {name}', arch[name], num_stages)
        check_positive_int('patch_size', patch_size)
        check_positive_int('in_channels', in_channels)
        for name, rate in drop_rates.items():
            check_probability(name, rate)
        grids = self._stage_grids(to_2tuple(pretrain_img_size), patch_size, num_stages)
        return arch, grids

    def _parse_arch(self, arch: Union[str, dict]) -> dict:
        name = type(self).__name__
        if isinstance(arch, str):
            if arch.lower() not in self.arch_zoo:
                raise KeyError(f'Unknown {name} arch {arch!r}; choose from '
                               f'{sorted(k for k in self.arch_zoo if len(k) > 1)}'
                               ' or pass a dict')
            arch = {**self._arch_defaults, **self.arch_zoo[arch.lower()]}
        elif isinstance(arch, dict):
            missing = [k for k in self._arch_keys if k not in arch]
            if missing:
                raise KeyError(f'{name} arch dict misses keys {missing} '
                               f'(needs {list(self._arch_keys)})')
        else:
            raise TypeError(f'{name} arch must be a str or dict, got {type(arch)}')
        arch = {
            k: list(arch[k]) if isinstance(arch[k], (list, tuple)) else arch[k]
            for k in self._arch_keys
        }
        lengths = {k: len(v) for k, v in arch.items() if isinstance(v, list)}
        if len(set(lengths.values())) != 1:
            raise ValueError(f'{name} arch lists differ in length: {lengths}')
        check_stage_list('arch depths', arch['depths'], len(arch['depths']))
        return arch

    @staticmethod
    def _stage_grids(pretrain_img_size: Tuple[int, int], patch_size: int,
                     num_stages: int) -> List[Tuple[int, int]]:
        """The token grid of every stage at ``pretrain_img_size`` (patch, then
        halving); an error when a stage would have no token."""
        for s in pretrain_img_size:
            check_positive_int('pretrain_img_size', s)
        grid = [s // patch_size for s in pretrain_img_size]
        grids = [tuple(s // 2**i for s in grid) for i in range(num_stages)]
        if min(grids[-1]) < 1:
            smallest = patch_size * 2**(num_stages - 1)
            raise ValueError(f'pretrain_img_size={tuple(pretrain_img_size)} is too small for '
                             f'patch_size={patch_size} and {num_stages} stages: stage '
                             f'{num_stages - 1} would have a {grids[-1]} grid (needs >= '
                             f'{smallest} per side)')
        return grids

    def _setup_stages(self, num_stages: int, attn_types: str, out_indices: Sequence[int],
                      frozen_stages: int, norm_eval: bool, with_cp: bool) -> None:
        """Validate and store the per-stage options both backbones take."""
        given = attn_types
        if isinstance(attn_types, (list, tuple)):  # one letter per stage, as a list
            attn_types = ''.join(
                a if isinstance(a, str) and len(a) == 1 else '?' for a in attn_types)
        if not isinstance(attn_types, str) or len(attn_types) != num_stages or set(
                attn_types.upper()) - set('LS'):
            raise ValueError(f"attn_types must be {num_stages} letters of 'L'/'S' (one per "
                             f"stage, e.g. {'L' * num_stages!r}), got {given!r}")
        attn_types = attn_types.upper()
        if is_int(out_indices):  # one stage, as mmdet's and mmpretrain's backbones take it
            out_indices = (out_indices, )
        if not isinstance(out_indices, (list, tuple)) or not all(map(is_int, out_indices)):
            raise TypeError(f'out_indices must be an int or a list/tuple of ints (stages '
                            f'0..{num_stages - 1}), got {out_indices!r} '
                            f'({type(out_indices).__name__})')
        out_indices = tuple(int(i) for i in out_indices)
        if not out_indices or any(i < 0 or i >= num_stages for i in out_indices):
            raise ValueError(f'out_indices must name stages in '
                             f'0..{num_stages - 1}, got {out_indices}')
        if not is_int(frozen_stages):
            raise TypeError(f'frozen_stages must be an int in -1..{num_stages} (-1: nothing '
                            f'frozen), got {frozen_stages!r} ({type(frozen_stages).__name__})')
        frozen_stages = int(frozen_stages)
        if not -1 <= frozen_stages <= num_stages:
            raise ValueError(f'frozen_stages must be in -1..{num_stages}, '
                             f'got {frozen_stages}')
        self.attn_types = attn_types
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp

    @property
    def out_channels(self) -> List[int]:
        """The channels of the maps :meth:`forward` returns, in their order."""
        return [c for i, c in enumerate(self.num_features) if i in self.out_indices]

    def forward_stages(self, x):
        """Yield (raw stage tokens (B, h*w, C), (h, w)) for every stage."""
        raise NotImplementedError

    def _stage_output(self, index: int, tokens):
        """Hook applied to the tokens of each returned stage (default: as they are)."""
        return tokens

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """Images (B, C, H, W) -> the maps of the ``out_indices`` stages."""
        self._check_images(x)
        outs = []
        last = max(self.out_indices)
        for i, (tokens, hw_shape) in enumerate(self.forward_stages(x)):
            if i in self.out_indices:
                # contiguous (B, C, H, W), as mmdet's and mmseg's backbones return: the
                # token layout viewed as a map is channels-last, which convolutions
                # carry on to the neck's outputs, and mmcv's compiled ops (RoIAlign in
                # every two-stage head, among others) index their input as plain NCHW
                # without checking its strides: they would read scrambled features
                outs.append(nlc_to_nchw(self._stage_output(i, tokens), hw_shape).contiguous())
            if i == last:
                break
        return tuple(outs)

    def _check_images(self, x: Tensor) -> None:
        """A named error unless ``x`` is a non-empty (B, in_channels, H, W) batch."""
        name = type(self).__name__
        if x.dim() != 4:
            raise ValueError(f'{name} expects (B, C, H, W) images, '
                             f'got {tuple(x.shape)}')
        in_channels = self._in_channels()

        def size_error():
            if 0 in x.shape:
                return f'{name} got an empty batch or image: input shape {tuple(x.shape)}'
            if x.shape[1] != in_channels:
                return (f'{name} expects {in_channels} input channels (in_channels), got '
                        f'images of shape {tuple(x.shape)}')
            return None

        check_sizes(size_error)

    def _in_channels(self) -> int:
        first = next(m for m in self.modules() if isinstance(m, nn.Conv2d))
        return first.in_channels

    def _frozen_modules(self):
        raise NotImplementedError

    def _freeze_stages(self) -> None:
        for module in self._frozen_modules():
            _freeze(module)

    def train(self, mode: bool = True):
        """Set the mode; frozen stages (and BN layers with ``norm_eval``) stay in
        eval mode."""
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    def init_weights(self) -> None:
        """Load ``init_cfg`` Pretrained weights (official files converted on the
        fly, strict), warm-start from softmax weights (``init_cfg=dict(type=
        'WarmStart', checkpoint=..., prefix=...)``: :mod:`~polaformer_mm.models.warm_start`),
        or apply the official initialisation without ``init_cfg``."""
        init_cfg = self.init_cfg
        if isinstance(init_cfg, dict) and init_cfg.get('type') == 'WarmStart':
            # the initializer that :mod:`~polaformer_mm.models.warm_start` registers; it
            # sets ``warm_start_report``: what was loaded, what is new, what was unused
            initializer = WEIGHT_INITIALIZERS.get('WarmStart')
            if initializer is None:
                raise KeyError("init_cfg type='WarmStart' needs polaformer_mm.models."
                               'warm_start imported (it registers the initializer)')
            initializer(**{k: v for k, v in init_cfg.items() if k != 'type'})(self)
            return
        if isinstance(init_cfg, dict) and init_cfg.get('type') == 'Pretrained':
            # Handled here rather than by mmengine's PretrainedInit so that an
            # official checkpoint (which carries a pickled yacs config and official
            # key names) also works, and is converted on the fly.
            from ..official_weights import load_backbone_weights
            checkpoint = init_cfg.get('checkpoint')
            state_dict = load_backbone_weights(
                checkpoint, family=self.family, prefix=init_cfg.get('prefix', None))
            self._load_pretrained(state_dict, checkpoint)
            self._is_init = True
            return
        if init_cfg is None:
            self._official_init()
            self._is_init = True
            return
        super().init_weights()

    def _optional_key(self, key: str) -> bool:
        """Keys a pretrained checkpoint may lack or carry beyond this model."""
        return False

    def _load_pretrained(self, state_dict, source) -> None:
        """Load backbone weights; any other mismatch than optional keys is an error
        that names the keys (a wrong arch or setting would otherwise train from
        half-random weights)."""
        name = type(self).__name__
        own = self.state_dict()
        # keys of modules the backbone does not have (a whole-model file without the
        # 'backbone.' prefix: neck.*, head.*): no tensor of the backbone can take them
        tops = {k.split('.', 1)[0] for k in own}
        outside = [k for k in state_dict if k.split('.', 1)[0] not in tops]
        state_dict = {k: v for k, v in state_dict.items() if k not in outside}
        mismatched = [
            f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}'
            for k, v in state_dict.items() if k in own and v.shape != own[k].shape
        ]
        if mismatched:
            raise ValueError(f'{source!r} does not fit this {name}: {len(mismatched)} shape '
                             f'mismatches, e.g. {mismatched[:5]}. Check arch, attn_types, '
                             'la_sr_ratios, kernel_size and pretrain_img_size.')
        missing = [k for k in own if k not in state_dict and not self._optional_key(k)]
        unexpected = [k for k in state_dict if k not in own and not self._optional_key(k)]
        if missing or unexpected:
            raise KeyError(f'{source!r} does not fit this {name}: missing keys {missing[:8]} '
                           f'({len(missing)} in all), unexpected keys {unexpected[:8]} '
                           f'({len(unexpected)} in all). '
                           + self._pretrained_advice(state_dict, missing))
        self.load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict=False)
        kept = [k for k in own if k not in state_dict]
        logger = MMLogger.get_current_instance()
        logger.info(f'{name}: loaded {len(own) - len(kept)} tensors from {source}'
                    + (f'; kept the initial values of {kept}' if kept else '')
                    + (f'; left {len(outside)} keys of modules outside the backbone unused '
                       f'({sorted({k.split(".", 1)[0] for k in outside})})' if outside else ''))

    def _pretrained_advice(self, state_dict, missing) -> str:
        """What to do about a file that does not fit: a softmax file (no Pola attention
        in it, Pola attention missing) warm-starts; anything else is another size or
        setting."""
        pola_missing = [k for k in missing if re.search(POLA_KEYS, k)]
        if pola_missing and not any(re.search(POLA_KEYS, k) for k in state_dict):
            return ("The file holds no Pola attention (a softmax checkpoint?): warm-start "
                    "from it with init_cfg=dict(type='WarmStart', checkpoint=...), which "
                    'loads every tensor of the same meaning and initialises the Pola-only '
                    'ones, or convert it once with tools/model_converters/softmax2pola.py '
                    '(docs/user_guides/warm_start.md).')
        return 'Check arch and attn_types.'

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
