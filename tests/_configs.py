"""The repository's config files, parsed once per test session (``Config.fromfile`` also
imports each config's ``custom_imports``): the config tests share one cache."""
import contextlib
import os.path as osp
from functools import lru_cache

import torch
from mmengine.config import Config

from tests import REPO


@lru_cache(maxsize=None)
def load_config(path: str) -> Config:
    """The config at ``path`` (relative to the repository root), parsed once. Callers
    that change it take a ``.copy()``."""
    return Config.fromfile(osp.join(REPO, path))


#: torch's random initialisers, which ``nn.Linear`` / ``nn.Conv2d`` / ``nn.Embedding`` call
#: while they are built (``init_weights`` is not called by a build)
_RANDOM_INITS = ('uniform_', 'normal_', 'trunc_normal_', 'kaiming_uniform_', 'kaiming_normal_',
                 'xavier_uniform_', 'xavier_normal_', 'orthogonal_')


@contextlib.contextmanager
def zero_initialised():
    """Models built inside start from zeros where torch would draw random numbers: the
    same modules, parameters, buffers and shapes, without the random draws that take most
    of a full-size model's build on the CPU (2.2 s of 2.3 for DeiT-B). For tests that
    read a model's structure (channels, parameter groups), not its values."""
    saved = {name: getattr(torch.nn.init, name) for name in _RANDOM_INITS}

    def zero(tensor, *args, **kwargs):
        with torch.no_grad():
            return tensor.zero_()

    try:
        for name in saved:
            setattr(torch.nn.init, name, zero)
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)
