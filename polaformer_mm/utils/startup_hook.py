"""A start-up hook that makes the import order of torchvision and polaformer_mm irrelevant.

Where torchvision's compiled ops cannot load (PyPI's CUDA torchvision beside a CPU-only
torch, see :mod:`.torchvision_compat`), ``import torchvision`` fails unless polaformer_mm
registered its stand-in operators first. ``make install`` therefore runs
``python -m polaformer_mm.utils.startup_hook``, which writes two files into the
virtualenv's site-packages:

* ``polaformer_mm-startup.pth``: one line, ``import _polaformer_mm_startup``, which
  Python's ``site`` module runs at every interpreter start;
* ``_polaformer_mm_startup.py``: a copy of this file.

At start-up the hook only puts a finder at the front of ``sys.meta_path`` (nothing else
is imported, so start-up stays as fast as before). The first time anything imports
torchvision, the finder removes itself, loads ``polaformer_mm/utils/torchvision_compat.py``
of the polaformer_mm that ``sys.path`` finds (without importing the package), and calls
its ``ensure_torchvision_importable()``, which does nothing when torchvision's own
extension loads. The import of torchvision then proceeds as usual.

Uninstall: delete the two files (their paths are printed on install). Writing them again
is idempotent.

This file imports only the standard library, and at start-up only ``sys``: it also runs
as the copy in site-packages, at every interpreter start.
"""
import sys

PTH_NAME = 'polaformer_mm-startup.pth'
MODULE_NAME = '_polaformer_mm_startup'
COMPAT_NAME = 'polaformer_mm.utils.torchvision_compat'


class TorchvisionImportHook:
    """A ``sys.meta_path`` finder that runs once, on the first import of torchvision."""

    def find_spec(self, name, path=None, target=None):
        """On the first ``import torchvision``: register the operator stand-ins if
        needed, then step aside (torchvision itself is found by the usual finders)."""
        if name == 'torchvision':
            self.remove()
            try:
                prepare_torchvision()
            except Exception as err:  # never break the import it was asked about
                print(f'polaformer_mm start-up hook: {err!r}', file=sys.stderr)
        return None  # the regular finders import torchvision

    def remove(self) -> None:
        """Take this finder off ``sys.meta_path``."""
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]


def prepare_torchvision() -> bool:
    """Load polaformer_mm's torchvision_compat by path and let it register the stand-in
    operators if torchvision's own cannot load; True when it did."""
    import importlib.util
    import os.path as osp
    module = sys.modules.get(COMPAT_NAME)
    if module is None:
        spec = importlib.util.find_spec('polaformer_mm')  # does not import it
        if spec is None or not spec.submodule_search_locations:
            return False
        for location in spec.submodule_search_locations:
            path = osp.join(location, 'utils', 'torchvision_compat.py')
            if osp.isfile(path):
                break
        else:
            return False
        compat_spec = importlib.util.spec_from_file_location(COMPAT_NAME, path)
        module = importlib.util.module_from_spec(compat_spec)
        compat_spec.loader.exec_module(module)
        # ``import polaformer_mm`` later finds and reuses this very module (and its state)
        sys.modules[COMPAT_NAME] = module
    return bool(module.ensure_torchvision_importable())


def install() -> None:
    """Put the hook at the front of ``sys.meta_path`` (once)."""
    if not any(
            isinstance(f, TorchvisionImportHook)
            or type(f).__name__ == TorchvisionImportHook.__name__ for f in sys.meta_path):
        if 'torchvision' not in sys.modules:
            sys.meta_path.insert(0, TorchvisionImportHook())


def write_startup_hook(site_dir=None) -> list:
    """Write the ``.pth`` file and the hook module into ``site_dir``.

    Args:
        site_dir (str, optional): a directory whose ``.pth`` files Python processes at
            start-up. Default: the running interpreter's site-packages (``purelib``).

    Returns:
        list[str]: the two paths written.
    """
    import os
    import os.path as osp
    import sysconfig
    site_dir = site_dir or sysconfig.get_paths()['purelib']
    os.makedirs(site_dir, exist_ok=True)
    module_path = osp.join(site_dir, MODULE_NAME + '.py')
    pth_path = osp.join(site_dir, PTH_NAME)
    with open(__file__, encoding='utf-8') as f:
        module_text = f.read()
    for path, text in ((module_path, module_text), (pth_path, f'import {MODULE_NAME}\n')):
        tmp = f'{path}.tmp{os.getpid()}'
        with open(tmp, 'w', encoding='utf-8') as f:
            f.write(text)
        os.replace(tmp, path)  # a concurrent interpreter start never sees half a file
    import py_compile
    try:  # bytecode now, so that no start-up compiles it (PYTHONDONTWRITEBYTECODE)
        py_compile.compile(module_path, doraise=True)
    except (OSError, py_compile.PyCompileError):
        pass
    return [module_path, pth_path]


if __name__ == MODULE_NAME:  # imported by the .pth line at interpreter start-up
    install()
elif __name__ == '__main__':
    for written in write_startup_hook(sys.argv[1] if len(sys.argv) > 1 else None):
        print(f'wrote {written}')
