"""One live run per work dir: a lock file that :class:`~.runner.PolaRunner` takes at start.

Two runs writing into one work dir share the timestamp folder and the log, and overwrite
each other's ``epoch_N.pth``. The runner therefore takes ``<work_dir>/run.lock`` before
anything is written there (distributed runs: rank 0 only) and gives it back when the run
ends; a second run on the same work dir stops at once with a
:class:`WorkDirLockedError` naming the run that holds it (pid, host, start time, command).

The lock is a POSIX record lock (``fcntl.lockf``) on that file, held while the run lives:
the kernel releases it when the process ends in any way, so a run killed by SIGKILL or a
crash leaves a *stale* file that the next run (``--resume``) takes over, with a note
naming the run that left it. The record lock is not inherited by forked data-loader
workers, and network file systems with lock support (NFS) enforce it across hosts. The
file holds the owner's pid, host, start time and command, one JSON object.

Runners of one process share the lock of a work dir (e.g. a test that resumes in the same
process). Where the platform has no ``fcntl`` or the file system refuses record locks,
the run goes on unlocked after a warning.
"""
import atexit
import contextlib
import datetime
import errno
import json
import os
import os.path as osp
import shlex
import socket
import sys
import threading
import warnings
from typing import Dict, Optional

try:
    import fcntl
except ImportError:  # pragma: no cover  (Windows)
    fcntl = None

__all__ = ['LOCK_FILE', 'WorkDirLock', 'WorkDirLockedError', 'lock_work_dir']

#: The lock file's name inside a work dir.
LOCK_FILE = 'run.lock'

# errors of file systems without record locks
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class WorkDirLockedError(RuntimeError):
    """The work dir is in use by another live run."""


class _Held:
    """The lock of one work dir, as this process holds it."""

    def __init__(self, path: str, fd: Optional[int], info: dict):
        self.path, self.fd, self.info = path, fd, info
        self.count = 0
        self.owner = os.getpid()


_HELD: Dict[str, _Held] = {}
_GUARD = threading.Lock()


def _describe(info: Optional[dict]) -> str:
    if not info:
        return 'a run that has not written its details yet'
    return (f'pid {info.get("pid")} on host {info.get("host")}, started '
            f'{info.get("started")}, command: {info.get("command")}')


def _read_info(fd: int) -> Optional[dict]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 1 << 16).decode('utf-8', 'replace')
        info = json.loads(text)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _same_file(fd: int, path: str) -> bool:
    """Whether ``fd`` is still the file at ``path`` (a releasing run unlinks it)."""
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _open_locked(path: str, work_dir: str):
    """(fd, the previous content) of ``path``, locked by this process; None when the
    platform or file system has no record locks."""
    if fcntl is None:
        return None, None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            info = _read_info(fd)
            os.close(fd)
            if err.errno in (errno.EACCES, errno.EAGAIN):
                raise WorkDirLockedError(
                    f'work dir {work_dir} is in use by another run ({_describe(info)}; lock '
                    f'file {path}): wait for it to end or give this run another --work-dir'
                ) from None
            if err.errno in _NO_LOCKS:
                return None, None
            raise
        if _same_file(fd, path):
            return fd, _read_info(fd)
        os.close(fd)  # locked a file that its owner had just removed: try again


def _release(held: _Held) -> None:
    if held.owner != os.getpid():  # a forked child: the lock is its parent's
        return
    if held.fd is not None:
        if _same_file(held.fd, held.path):
            with contextlib.suppress(OSError):
                os.remove(held.path)
        with contextlib.suppress(OSError):
            os.close(held.fd)  # releases the record lock
        held.fd = None


class WorkDirLock:
    """This process's share of the lock on a work dir (see the module notes).

    Build it with :func:`lock_work_dir`. :meth:`release` gives the share back; the lock
    itself goes (and the lock file is removed) when the last share of the process is
    given back, or when the process ends.
    """

    def __init__(self, held: _Held, previous: Optional[dict]):
        self._held: Optional[_Held] = held
        #: the details of a run that ended without releasing the lock (a crash), if any
        self.previous = previous

    @property
    def path(self) -> Optional[str]:
        """The lock file (None once released)."""
        return self._held.path if self._held else None

    @property
    def locked(self) -> bool:
        """Whether the work dir is locked (False where record locks are unavailable)."""
        return bool(self._held and self._held.fd is not None)

    def release(self) -> None:
        """Give this share back (once; later calls do nothing)."""
        with _GUARD:
            held, self._held = self._held, None
            if held is None:
                return
            held.count -= 1
            if held.count <= 0:
                _HELD.pop(held.path, None)
                _release(held)


def lock_work_dir(work_dir: str, command: Optional[str] = None) -> WorkDirLock:
    """Take the lock on ``work_dir`` (created if missing) for this process.

    Args:
        work_dir (str): the run's work dir.
        command (str, optional): how the lock file names the run. Default: this
            process's command line.

    Returns:
        WorkDirLock: this process's share; its ``previous`` names a crashed run whose
        stale lock file was taken over.

    Raises:
        WorkDirLockedError: another live process holds the lock; the message names it.
    """
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(osp.realpath(work_dir), LOCK_FILE)
    with _GUARD:
        held = _HELD.get(path)
        if held is not None and held.owner != os.getpid():  # inherited through fork
            _HELD.clear()
            held = None
        previous = None
        if held is None:
            info = dict(
                pid=os.getpid(),
                host=socket.gethostname(),
                started=datetime.datetime.now().isoformat(timespec='seconds'),
                command=command or shlex.join([osp.basename(sys.executable)] + sys.argv))
            fd, previous = _open_locked(path, work_dir)
            if fd is None:
                warnings.warn(
                    f'work dir {work_dir}: this platform or file system has no file locks, '
                    'so nothing stops a second run from writing into it too',
                    RuntimeWarning,
                    stacklevel=2)
            else:
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(info) + '\n').encode(), 0)
            held = _HELD[path] = _Held(path, fd, info)
        held.count += 1
    return WorkDirLock(held, previous or None)


@atexit.register
def _release_all() -> None:
    with _GUARD:
        for held in list(_HELD.values()):
            _release(held)
        _HELD.clear()
