"""The scripts under ``tools/`` (and ``.dev_scripts/``) as modules, for the tests that call
their functions (the scripts are no package: each is loaded from its file)."""
import importlib.util
import os.path as osp
from types import ModuleType
from typing import Optional

from tests import REPO


def load_tool(path: str, name: Optional[str] = None, folder: str = 'tools') -> ModuleType:
    """Execute ``<folder>/<path>`` (e.g. ``'analysis_tools/get_flops.py'`` of ``tools/``) as
    a new module named ``name`` (default: the file's name without ``.py``) and return it."""
    name = name or osp.splitext(osp.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, osp.join(REPO, folder, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
