"""Output paths of the command lines, checked before any work: a run that measures for an
hour must not find at its end that it cannot write its results.

:func:`check_output_dir` makes a folder (if missing) and writes a probe file in it;
:func:`check_output_file` checks that a file can be created (or overwritten) where it is
named, without leaving one behind. Both raise :class:`OutputPathError` naming the option
and the path, for the command line to print as a usage error. :func:`check_distinct_outputs`
refuses two output options of one command naming the same path (one would overwrite the
other); :func:`check_output_files` checks a command's output files both ways.
:func:`check_run_options` checks what the ONNX benchmark and profile tools share:
their CONFIG H W triples and their ``--out-md``, ``--out-json`` and ``--work-dir``.
"""
import os
import os.path as osp
import tempfile
from typing import Any, Callable, Dict, Optional, Sequence

__all__ = [
    'OutputPathError', 'check_output_dir', 'check_output_file', 'check_distinct_outputs',
    'check_output_files', 'check_run_options'
]


class OutputPathError(ValueError):
    """An output path that cannot be written (the message names the option and the path)."""


def _reason(err: OSError) -> str:
    return f'{type(err).__name__}: {err.strerror or err}'


def _probe(folder: str) -> None:
    """Create and remove a file in ``folder`` (raises OSError if that is not possible)."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix='.write_probe_'):
        pass


def check_output_dir(option: str, path: str) -> str:
    """Make the folder ``path`` (given as ``option``) if missing and check that files can
    be written in it; returns its absolute path."""
    folder = osp.abspath(path)
    if osp.exists(folder) and not osp.isdir(folder):
        raise OutputPathError(f'{option} {path}: not a folder (a file of that name exists)')
    try:
        os.makedirs(folder, exist_ok=True)
        _probe(folder)
    except OSError as err:
        raise OutputPathError(f'{option} {path}: cannot write there ({_reason(err)})') from None
    return folder


def check_output_file(option: str, path: str, makes_folder: bool = False) -> str:
    """Check that the file ``path`` (given as ``option``) can be written: its folder exists
    and takes new files, and the path is not a folder (nor an existing file that cannot be
    overwritten); returns its absolute path. Nothing is left behind. ``makes_folder``: the
    writer makes a missing folder, so the nearest folder that exists must take new ones."""
    target = osp.abspath(path)
    folder = osp.dirname(target)
    if osp.isdir(target):
        raise OutputPathError(f'{option} {path}: is a folder, not a file')
    if makes_folder:
        while not osp.exists(folder) and osp.dirname(folder) != folder:
            folder = osp.dirname(folder)
    if osp.exists(folder) and not osp.isdir(folder):
        raise OutputPathError(f'{option} {path}: {folder} is a file, not a folder')
    if not osp.isdir(folder):
        raise OutputPathError(f'{option} {path}: the folder {folder} does not exist')
    if osp.exists(target) and not os.access(target, os.W_OK):
        raise OutputPathError(f'{option} {path}: the file exists and cannot be overwritten')
    try:
        _probe(folder)
    except OSError as err:
        raise OutputPathError(f'{option} {path}: cannot write in {folder} ({_reason(err)})') \
            from None
    return target


def check_distinct_outputs(outputs: Dict[str, Optional[str]]) -> None:
    """An :class:`OutputPathError` when two of ``outputs`` (option -> path, None for an
    option not given) name the same path, e.g. ``--json r.json --out-md r.json``: the file
    written last would replace the other."""
    seen: Dict[str, str] = {}
    for option, path in outputs.items():
        if not path:
            continue
        key = osp.normcase(osp.realpath(path))
        if key in seen:
            raise OutputPathError(f'{seen[key]} and {option} both name {path}: one output would '
                                  'overwrite the other; give each its own path')
        seen[key] = option


def check_output_files(outputs: Dict[str, Optional[str]], makes_folder: bool = False) -> None:
    """The output files of one command (option -> path, None for an option not given): no
    two the same (:func:`check_distinct_outputs`), each writable where it is named
    (:func:`check_output_file`, with ``makes_folder``)."""
    check_distinct_outputs(outputs)
    for option, path in outputs.items():
        if path:
            check_output_file(option, path, makes_folder=makes_folder)


def check_run_options(error: Callable[[str], Any], triples: Sequence[str], out_md: Optional[str],
                      out_json: Optional[str], work_dir: Optional[str]) -> None:
    """Check a command line's CONFIG H W ``triples`` (integer H and W) and its output
    options (no two naming the same path, :func:`check_output_file` for ``--out-md`` /
    ``--out-json``, :func:`check_output_dir` for ``--work-dir``); ``error`` (an argument parser's
    ``error``) is called with the first problem's message."""
    if len(triples) % 3:
        error('runs are CONFIG H W triples')
    for i in range(0, len(triples), 3):
        if not (triples[i + 1].isdigit() and triples[i + 2].isdigit()):
            error(f'runs are CONFIG H W triples: {" ".join(triples[i:i + 3])} has no integer H W')
    try:
        check_distinct_outputs({'--out-md': out_md, '--out-json': out_json, '--work-dir': work_dir})
        for option, out in (('--out-md', out_md), ('--out-json', out_json)):
            if out:
                check_output_file(option, out)
        if work_dir:
            check_output_dir('--work-dir', work_dir)
    except OutputPathError as err:
        error(str(err))
