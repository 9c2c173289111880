"""The repository's config files, parsed once per test session (``Config.fromfile`` also
imports each config's ``custom_imports``): the config tests share one cache."""
import os.path as osp
from functools import lru_cache

from mmengine.config import Config

from tests import REPO


@lru_cache(maxsize=None)
def load_config(path: str) -> Config:
    """The config at ``path`` (relative to the repository root), parsed once. Callers
    that change it take a ``.copy()``."""
    return Config.fromfile(osp.join(REPO, path))
