import os
import os.path as osp

# One thread per test process (and per process a test starts, unless it sets its own): the
# tests run small tensors, where OpenMP threads cost more in synchronisation than they
# gain, and on a shared machine a thread that waits on a busy core stalls the other for
# seconds. Set before torch is imported (polaformer_mm imports it).
os.environ.setdefault('OMP_NUM_THREADS', '1')

import pytest  # noqa: E402
import torch  # noqa: E402

import polaformer_mm  # noqa: F401,E402  (registers the models)

#: a test that is not marked slow takes at most this many seconds (set-up and call, on a
#: quiet 2-core machine; docs/notes/developer_guide.md): the session's summary names those
#: that took longer, to be made faster or marked slow
FAST_TEST_LIMIT_S = 20

DATA_DIR = osp.join(osp.dirname(osp.abspath(__file__)), 'data')
GOLDEN_DIR = osp.join(DATA_DIR, 'golden')


def pytest_configure(config):
    """Session set-up: one torch thread, and the external config index read once."""
    threads = os.environ.get('OMP_NUM_THREADS', '').split(',')[0]
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else 1)
    _read_package_metafiles_once()


def _read_package_metafiles_once():
    """mmengine resolves a config's ``mmdet::`` / ``mmseg::`` / ``mmpretrain::`` base by
    parsing every metafile of that package (about 250 YAML files for mmdet) and reloading
    ``pkg_resources``, about half a second for each such base of each config parsed; the
    config tests parse every shipped config. The installed packages do not change during a
    session: each metafile is parsed once and each package looked up once (the same values
    mmengine reads, shared read-only)."""
    from mmengine.config import config as config_module
    from mmengine.config import utils as config_utils
    real_load, real_is_installed = config_utils.load, config_module.is_installed
    parsed, installed = {}, {}

    def load(file, *args, **kwargs):
        if args or kwargs or not isinstance(file, str) or not file.endswith('.yml'):
            return real_load(file, *args, **kwargs)
        key = osp.abspath(file)
        if key not in parsed:
            parsed[key] = real_load(file)
        return parsed[key]

    def is_installed(package):
        if package not in installed:
            installed[package] = real_is_installed(package)
        return installed[package]

    config_utils.load = load
    config_module.is_installed = is_installed


def pytest_terminal_summary(terminalreporter):
    """Name the tests not marked slow whose set-up and call took over the limit."""
    took = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, 'when', None) in ('setup', 'call') and \
                    'slow' not in getattr(report, 'keywords', {}):
                took[report.nodeid] = took.get(report.nodeid, 0.) + report.duration
    over = sorted(((t, n) for n, t in took.items() if t > FAST_TEST_LIMIT_S), reverse=True)
    if over:
        terminalreporter.section(f'tests not marked slow over {FAST_TEST_LIMIT_S} s')
        for seconds, nodeid in over:
            terminalreporter.write_line(f'{seconds:7.1f} s  {nodeid}')
        terminalreporter.write_line('(mark them slow or make them faster: '
                                    'docs/notes/developer_guide.md, "Test time")')


@pytest.fixture(scope='session')
def golden_dir():
    return GOLDEN_DIR


@pytest.fixture(scope='session')
def synthetic_data_root(tmp_path_factory):
    """The small synthetic COCO / ADE20K-layout dataset of ``tests/_smoke.py``, generated
    once per session. Shared: tests that change files of their dataset make their own."""
    from ._smoke import synthetic_root
    return synthetic_root(tmp_path_factory.mktemp('data'))


def _managed_classes():
    """mmengine's named-singleton classes (``ManagerMixin``: DefaultScope, MessageHub,
    MMLogger, the visualizers), each with its own instance table."""
    from mmengine.utils import ManagerMixin
    found, todo = [], [ManagerMixin]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if '_instance_dict' in vars(cls):
            found.append(cls)
    return found


@pytest.fixture(autouse=True)
def _restore_mmengine_instances():
    """Each test starts from mmengine's global instances it found. A test that calls
    ``init_default_scope`` (as the tools do) would set the default scope of every test after
    it; a runner's visualizer is a named singleton that a later runner of the same name gets
    back, writing into the first test's ``tmp_path`` (removed when that test passed). The
    instances a test created are dropped when it ends (a logger's files closed)."""
    saved = {cls: dict(cls._instance_dict) for cls in _managed_classes()}
    yield
    for cls in _managed_classes():
        before = saved.get(cls, {})
        for name, instance in list(cls._instance_dict.items()):
            if before.get(name) is not instance:
                for handler in list(getattr(instance, 'handlers', ())):
                    handler.close()
        cls._instance_dict.clear()
        cls._instance_dict.update(before)
