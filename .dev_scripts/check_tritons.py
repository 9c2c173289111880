#!/usr/bin/env python
"""Run the fused kernels' checks against several Triton releases, without a GPU.

    python .dev_scripts/check_tritons.py [--versions 2.1.0 3.0.0 3.3.1 ...]
        [--python .venv/bin/python] [--scratch DIR] [--jobs 2] [--out-md PATH]

Each release is installed with ``pip install --target SCRATCH/triton-X --no-deps
triton==X`` (once; numpy<2 beside the releases whose interpreter needs it, 3.0 and 3.1)
and put ahead of the stack's own Triton on ``PYTHONPATH``, and four checks run in fresh
processes with no GPU visible:

* import -- the kernels' module loads (``triton_backend.available()``);
* compile -- ``tools/analysis_tools/compile_kernels.py`` compiles every kernel in every
  autotune configuration for sm_80 (float32, IEEE products, head width 64) and says
  whether each case has a configuration that fits;
* self-check -- ``tools/kernel_check.py --quick --interpret --no-timing`` (Triton's
  interpreter, 3.0 and later);
* key + pruning -- ``tests/test_ops/test_triton_autotune.py``: the autotune key each
  release finds, and Triton's own Autotuner driven on CPU tensors up to the pruning.

A version may name its interpreter as ``VERSION@PYTHON`` (e.g. ``2.1.0@.venv-oldest/bin/python``,
torch 2.1 as CI's oldest stack); the default is ``--python``. Prints one Markdown table
(the one in docs/advanced_guides/gpu_check.md) and writes it to ``--out-md``; the exit
status is 1 when a check failed.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import tempfile

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEFAULT_VERSIONS = ('2.1.0', '3.0.0', '3.1.0', '3.2.0', '3.3.1', '3.4.0', '3.7.1')
#: Releases whose interpreter stores nothing with numpy 2 (compiled before numpy 2's ABI).
NEEDS_NUMPY_1 = ('3.0.', '3.1.')

# Loads polaformer_mm's op folder without the package's __init__ (as tools/kernel_check.py).
IMPORT_CHECK = '''
import importlib.machinery, importlib.util, json, sys
spec = importlib.machinery.ModuleSpec('polaformer_mm', None, is_package=True)
spec.submodule_search_locations = [{repo!r} + '/polaformer_mm']
sys.modules['polaformer_mm'] = importlib.util.module_from_spec(spec)
import numpy, torch, triton
from polaformer_mm.ops.pola_attention import triton_backend
print(json.dumps(dict(triton=triton.__version__, torch=torch.__version__,
                      numpy=numpy.__version__, cuda=torch.cuda.is_available(),
                      available=triton_backend.available(),
                      reason=triton_backend.unavailable_reason())))
'''


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description='Check the fused kernels against Triton releases')
    p.add_argument('--versions', nargs='+', default=list(DEFAULT_VERSIONS))
    p.add_argument(
        '--python',
        default=osp.join(REPO, '.venv', 'bin', 'python'),
        help='the stack to run in (default: .venv/bin/python)')
    p.add_argument(
        '--scratch',
        default=osp.join(tempfile.gettempdir(), 'polaformer_mm-tritons'),
        help='where each release is installed (default: %(default)s)')
    p.add_argument('--jobs', type=int, default=2, help='compiler processes (default: 2)')
    p.add_argument('--out-md', help='write the table here')
    return p.parse_args(argv)


def _install(version: str, python: str, scratch: str) -> str:
    """``pip install --target`` of triton==version (and numpy<2 where its interpreter
    needs it) into a folder of its own; returns the folder."""
    folder = osp.join(scratch, f'triton-{version}')
    if osp.isdir(osp.join(folder, 'triton')):
        return folder
    packages = [f'triton=={version}']
    if version.startswith(NEEDS_NUMPY_1):
        packages.append('numpy<2')
    subprocess.run(
        [python, '-m', 'pip', 'install', '-q', '--no-deps', '--target', folder, *packages],
        check=True)
    return folder


def _run(cmd, folder: str, timeout: int = 1800, interpret: bool = False):
    """Run ``cmd`` in the repository with ``folder`` ahead on PYTHONPATH and no GPU
    visible; returns (exit status, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ('TRITON_INTERPRET', 'PYTHONPATH')}
    env.update(PYTHONPATH=os.pathsep.join([folder, REPO]), CUDA_VISIBLE_DEVICES='')
    env.setdefault('OMP_NUM_THREADS', '1')
    if interpret:
        env['TRITON_INTERPRET'] = '1'
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ''


def check_import(python: str, folder: str) -> dict:
    """The import check: the versions it ran with, and whether the kernels loaded."""
    code, out, err = _run([python, '-c', IMPORT_CHECK.format(repo=REPO)], folder)
    if code != 0:
        return dict(ok=False, cell=f'fails: {_last_line(err)[:120]}')
    info = json.loads(_last_line(out))
    info['ok'] = info['available'] and not info['cuda']
    info['cell'] = 'yes' if info['ok'] else f'no: {info["reason"][:120]}'
    return info


def check_compile(python: str, folder: str, jobs: int) -> dict:
    """The compile check: every kernel and configuration for sm_80."""
    with tempfile.TemporaryDirectory() as tmp:
        report = osp.join(tmp, 'report.json')
        code, out, err = _run([
            python, 'tools/analysis_tools/compile_kernels.py', '--targets', '80', '--dtypes',
            'float32', '--precisions', 'ieee', '--head-dims', '64', '--jobs',
            str(jobs), '--quiet', '--json', report
        ], folder)
        if not osp.exists(report):
            return dict(ok=False, cell=f'fails: {_last_line(err)[:120]}')
        with open(report) as f:
            data = json.load(f)
    variants, summary = data['variants'], data['summary']
    compiled = sum(v['error'] is None for v in variants)
    fitting = sum(s['fitting'] > 0 for s in summary)
    spill_free = sum(s['spill_free_fitting'] > 0 for s in summary)
    cell = (f'{compiled}/{len(variants)} compiled; {fitting}/{len(summary)} kernels fit, '
            f'{spill_free} without spills')
    return dict(ok=code == 0, cell=cell)


def check_selfcheck(python: str, folder: str, version: str) -> dict:
    """The quick self-check under the interpreter (Triton 3.0+)."""
    if version.split('.')[0] == '2':
        return dict(ok=True, cell='- (no interpreter)')
    code, out, err = _run(
        [python, 'tools/kernel_check.py', '--quick', '--interpret', '--no-timing'],
        folder,
        interpret=True)
    verdict = [line for line in out.splitlines() if ' passed, ' in line]
    cell = verdict[-1].split(' in ')[0] if verdict else f'fails: {_last_line(err)[:120]}'
    return dict(ok=code == 0, cell=cell)


def check_pruning(python: str, folder: str) -> dict:
    """The autotune key and the pruning through Triton's Autotuner (pytest)."""
    code, out, err = _run([
        python, '-m', 'pytest', 'tests/test_ops/test_triton_autotune.py', '-q', '-p',
        'no:cacheprovider'
    ], folder)
    verdict = _last_line(out).split(' in ')[0]  # '4 passed', without the seconds
    return dict(ok=code == 0, cell=verdict[:120] or _last_line(err)[:120])


def main(argv=None) -> int:
    """Install, check and print the table; returns the exit status."""
    args = parse_args(argv)
    header = ('| Triton | torch, numpy | import without a GPU | compile for sm_80 | '
              'self-check (interpreter) | key + pruning |')
    lines = [header, '|---|---|---|---|---|---|']
    print('\n'.join(lines), flush=True)
    failed = False
    for spec in args.versions:
        version, _, python = spec.partition('@')
        python = osp.abspath(python or args.python)
        folder = _install(version, python, args.scratch)
        info = check_import(python, folder)
        checks = [info]
        if info['ok']:
            checks += [
                check_compile(python, folder, args.jobs),
                check_selfcheck(python, folder, version),
                check_pruning(python, folder)
            ]
        else:
            checks += [dict(ok=False, cell='-')] * 3
        failed |= not all(c['ok'] for c in checks)
        stack = f'{info.get("torch", "?")}, {info.get("numpy", "?")}'
        line = f'| {info.get("triton", version)} | {stack} | ' + ' | '.join(c['cell']
                                                                            for c in checks) + ' |'
        lines.append(line)
        print(line, flush=True)
    if args.out_md:
        with open(args.out_md, 'w') as f:
            f.write('\n'.join(lines) + '\n')
    return int(failed)


if __name__ == '__main__':
    sys.exit(main())
