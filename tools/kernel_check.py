#!/usr/bin/env python
"""Kernel check: the fused Triton kernels of the attention op against its torch path, and
their speed, on a GPU machine that may have nothing but torch and Triton.

    python tools/kernel_check.py [--json PATH] [--quick] [--budget-s 165]
                                 [--timing-dtype float16] [--repeats 5] [--no-timing]
    TRITON_INTERPRET=1 python tools/kernel_check.py --quick    # on a CPU (the interpreter)

On CUDA it compares ``pola_linear_attention(backend='triton')`` with ``backend='torch'``,
forward and the gradients of q, k, v and power, in float32 / float16 / bfloat16, head
widths 32 / 64 / 128, at odd token counts and on the shared-shift edge cases, each within
the kernels' ``TOLERANCES``; then times forward and forward + backward of the Triton path,
the torch path and PyTorch's scaled_dot_product_attention at 3136, 12544 and 50176 tokens.
It prints one table as it goes (under 3 minutes on an H100) and writes ``--json PATH``
after every row (its place checked before the first row). Exit status: 0 when every check
passed, 1 when one failed, 2 for a bad command line, without a CUDA GPU (and without
``TRITON_INTERPRET=1``), with an interpreter that cannot run the kernels (Triton 2.x has none;
3.0 / 3.1's needs numpy<2), or when the op does not import (it lacks its few requirements, or
``POLA_ATTENTION_BACKEND`` holds a value it does not take). The
check is ``polaformer_mm.ops.pola_attention.selfcheck``'s; this script reads the command
line.
"""
import argparse
import importlib.machinery
import importlib.util
import math
import os
import os.path as osp
import sys

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _bare_package() -> None:
    """Make ``polaformer_mm``'s subpackages importable without running
    ``polaformer_mm/__init__.py``.

    ``import polaformer_mm`` imports the models, mmengine and the OpenMMLab stack, none of
    which this check needs and which a freshly lent GPU machine may not have. The op's
    folder needs only torch (Triton optional) and ``polaformer_mm.utils``' compat and
    capture modules. So, unless the real package is already imported, ``polaformer_mm`` is
    registered as a bare namespace over this repository's ``polaformer_mm/`` folder: its
    subpackages (``ops``, ``utils``) then import as usual, with their own ``__init__``,
    and the top-level ``__init__`` never runs.
    """
    if 'polaformer_mm' not in sys.modules:
        spec = importlib.machinery.ModuleSpec('polaformer_mm', None, is_package=True)
        spec.submodule_search_locations = [osp.join(REPO, 'polaformer_mm')]
        sys.modules['polaformer_mm'] = importlib.util.module_from_spec(spec)


def load_selfcheck():
    """Import ``polaformer_mm.ops.pola_attention.selfcheck`` without running
    ``polaformer_mm/__init__.py`` (:func:`_bare_package`)."""
    _bare_package()
    from polaformer_mm.ops.pola_attention import selfcheck
    return selfcheck


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description='Check the fused Triton kernels of '
                                'pola_linear_attention against its torch path, and time them')
    p.add_argument('--json', metavar='PATH', help='write every row and the verdict here')
    p.add_argument(
        '--quick',
        action='store_true',
        help='small cases and a tiny timing (for TRITON_INTERPRET=1 on a CPU)')
    p.add_argument(
        '--interpret',
        action='store_true',
        help='set TRITON_INTERPRET=1 before Triton is imported (the kernels on CPU tensors)')
    p.add_argument(
        '--budget-s',
        type=float,
        default=165.0,
        help='rows not begun after this many seconds are skipped (default 165)')
    p.add_argument('--timing-dtype', choices=('float32', 'float16', 'bfloat16'), default='float16')
    p.add_argument('--warmup', type=int, default=2, help='untimed calls before timing')
    p.add_argument('--repeats', type=int, default=5, help='timed calls (the median is shown)')
    p.add_argument('--no-timing', action='store_true', help='checks only')
    args = p.parse_args(argv)
    if args.warmup < 1 or args.repeats < 1:
        p.error(f'--warmup and --repeats must be >= 1, got {args.warmup} and {args.repeats}')
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):
        p.error(f'--budget-s must be a number of seconds > 0, got {args.budget_s}')
    if args.json:
        paths = _output_paths()
        try:  # before any row: a file is created and removed where --json names one
            paths.check_output_file('--json', args.json, makes_folder=True)
        except paths.OutputPathError as error:
            p.error(str(error))
    return args


def _output_paths():
    """``polaformer_mm.utils.output_paths`` (standard library only), imported without the
    package's ``__init__`` (:func:`_bare_package`), so that the check of ``--json`` imports
    nothing else of the package."""
    _bare_package()
    from polaformer_mm.utils import output_paths
    return output_paths


def main(argv=None) -> int:
    """Run the check; returns the exit status."""
    args = parse_args(argv)
    if args.interpret:
        os.environ['TRITON_INTERPRET'] = '1'
    try:
        selfcheck = load_selfcheck()
    except ImportError as e:
        print(
            f'kernel_check: the attention op does not import ({e}); it needs torch, '
            'numpy and, for the kernels, Triton >= 2.1',
            file=sys.stderr)
        return 2
    except ValueError as e:  # a setting read at import, e.g. POLA_ATTENTION_BACKEND
        print(f'kernel_check: the attention op does not import: {e}', file=sys.stderr)
        return 2
    import torch
    problem = selfcheck.interpreter_problem() if selfcheck.interpreting() else None
    if problem:
        print(f'kernel_check: TRITON_INTERPRET=1, but {problem}', file=sys.stderr)
        return 2
    if not selfcheck.interpreting() and not torch.cuda.is_available():
        fix = ('install a CUDA build of torch'
               if torch.version.cuda is None else 'check nvidia-smi and CUDA_VISIBLE_DEVICES')
        print(
            f'kernel_check needs a CUDA GPU, and torch {torch.__version__} '
            f'(CUDA build {torch.version.cuda}) sees none. On a GPU machine, {fix}; on a CPU, '
            'run the reduced check through Triton\'s interpreter: '
            'TRITON_INTERPRET=1 python tools/kernel_check.py --quick',
            file=sys.stderr)
        return 2
    result = selfcheck.run_selfcheck(
        quick=args.quick,
        timing_dtype=getattr(torch, args.timing_dtype),
        warmup=args.warmup,
        repeats=args.repeats,
        budget_s=args.budget_s,
        timing=not args.no_timing,
        json_path=args.json)
    if args.json:
        print(f'results: {args.json}')
    return 1 if result['failed'] else 0


if __name__ == '__main__':
    sys.exit(main())
