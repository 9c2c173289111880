"""Triton shims: every difference between the supported Triton releases (2.1 to 3.7) that the
fused kernels meet, decided here once, as :mod:`polaformer_mm.utils.compat` does for torch.

The kernels (:mod:`.triton_kernels`) are written against the oldest API (Triton 2.1, the
Triton of torch 2.1) and call these where a release differs:

* :func:`dot` / :func:`dot_acc` -- ``tl.dot`` takes ``input_precision=`` from Triton 3.0
  ('ieee' or 'tf32'), ``allow_tf32=`` and no accumulator before.
* :func:`autotune` -- Triton 2.x indexes ``prune_configs_by['perf_model']`` and
  ``['top_k']`` (both must be given); Triton 3.2 and 3.3 ask the driver for a benchmarker
  when ``autotune`` decorates (so a machine without a GPU could not import the kernels)
  unless their ``Autotuner`` is given a ``do_bench`` (3.2's ``autotune`` drops it).
* :func:`parameters` -- a ``JITFunction``'s ``params`` are Triton 3.x; 2.x has
  ``arg_names`` and the indices of its ``constexprs``.
* :func:`make_config` -- Triton 3.2's ``Config`` passes warp-specialisation options to
  every launch (0 by default), which its interpreter rejects: they are left out (the
  compiler's defaults are the same).
* :func:`config_options` -- ``Config.all_kwargs()`` is Triton 3.x.
* :data:`LAUNCH_OPTIONS` -- compiler options a launch may name (Triton 3.x).
* :func:`split_launch` -- the pruning's arguments: Triton 2.x calls
  ``early_config_prune(configs, nargs)``, 3.x ``(configs, nargs, **kwargs)`` with the
  launch's keyword arguments, ``grid`` and ``warmup`` among them.
* :func:`compile_on_device`, :func:`loaded_usage`, :func:`device_limits` -- compiling for
  the running GPU (``JITFunction.warmup``), the metadata (a dict on 2.x, a namedtuple on
  3.x), the driver's device properties (``driver.active`` on 3.x; 2.x has no
  ``max_num_regs``); the driver's ``n_spills`` counts 4-byte words of local memory.
* :func:`usage_on_target` -- compiling for a GPU named by its compute capability without
  one: on 2.x the stages of ``triton.compile(fn, ..., cc=)`` up to PTX (that function
  also links a launcher against the driver's ``libcuda.so``), on 3.x ``triton.compile`` of
  an ``ASTSource`` (constexprs as ``constants`` and out of the signature before 3.3) for a
  ``GPUTarget``; then the bundled ``ptxas`` with the flags of that release.
* :func:`interpreter_problem` -- Triton 3.0 / 3.1's interpreter writes nothing with numpy 2
  (its compiled helpers predate numpy 2's ABI); 2.x has no interpreter.

Imports Triton (torch only where a function needs it); the kernels' module imports this, and
the compile report reaches it through that module.
"""
import functools
import inspect
import os
import subprocess
import tempfile
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ...utils.compat import version_tuple
from .triton_resources import Limits, Usage, limits_of, parse_ptxas, ptxas_arch

__all__ = [
    'TRITON_VERSION', 'OutOfResources', 'dot', 'dot_acc', 'Param', 'parameters', 'autotune',
    'make_config', 'config_options', 'LAUNCH_OPTIONS', 'split_launch', 'compile_on_device',
    'loaded_usage', 'device_limits', 'usage_on_target', 'ptxas_path', 'target_compile_problem',
    'interpreter_problem'
]

#: The installed Triton's (major, minor, patch).
TRITON_VERSION = version_tuple(triton.__version__)

# --------------------------------------------------------------------------------------
# the language
# --------------------------------------------------------------------------------------

if 'input_precision' in inspect.signature(tl.dot).parameters:  # Triton 3.0+

    @triton.jit
    def dot(a, b, PRECISION: tl.constexpr):
        """``a @ b`` in float32 with ``PRECISION`` products ('ieee' or 'tf32')."""
        return tl.dot(a, b, input_precision=PRECISION)

    @triton.jit
    def dot_acc(a, b, acc, PRECISION: tl.constexpr):
        """``acc + a @ b`` in float32 with ``PRECISION`` products ('ieee' or 'tf32')."""
        return tl.dot(a, b, acc, input_precision=PRECISION)

else:  # Triton 2.x: allow_tf32, no accumulator (its compiler folds the addition into it)

    @triton.jit
    def dot(a, b, PRECISION: tl.constexpr):
        """``a @ b`` in float32 with ``PRECISION`` products ('ieee' or 'tf32')."""
        return tl.dot(a, b, allow_tf32=PRECISION == 'tf32')

    @triton.jit
    def dot_acc(a, b, acc, PRECISION: tl.constexpr):
        """``acc + a @ b`` in float32 with ``PRECISION`` products ('ieee' or 'tf32')."""
        return acc + tl.dot(a, b, allow_tf32=PRECISION == 'tf32')


class Param(NamedTuple):
    """A parameter of a ``triton.jit`` function: its name and whether it is a
    ``tl.constexpr``."""
    name: str
    is_constexpr: bool


def parameters(jit_fn) -> List[Param]:
    """The parameters of ``jit_fn`` (a ``triton.jit`` function), in order."""
    if hasattr(jit_fn, 'params'):  # Triton 3.x
        return [Param(p.name, bool(p.is_constexpr)) for p in jit_fn.params]
    constexprs = set(jit_fn.constexprs)
    return [Param(name, i in constexprs) for i, name in enumerate(jit_fn.arg_names)]


# --------------------------------------------------------------------------------------
# the autotuner
# --------------------------------------------------------------------------------------


def _driver_benchmark(kernel_call: Callable[[], object], quantiles):
    """The driver's benchmarker, asked for when a benchmark runs (not when ``autotune``
    decorates, which Triton 3.2 / 3.3 do unless given a ``do_bench``)."""
    from triton.runtime.driver import driver
    return driver.active.get_benchmarker()(kernel_call, quantiles=quantiles)


def _asks_driver_at_decoration() -> bool:
    """Whether ``Autotuner.__init__`` asks the driver for its benchmarker (Triton 3.2,
    3.3): it takes ``do_bench`` and has no lazy ``do_bench`` property (3.4+)."""
    from triton.runtime.autotuner import Autotuner
    takes = 'do_bench' in inspect.signature(Autotuner.__init__).parameters
    lazy = isinstance(inspect.getattr_static(Autotuner, 'do_bench', None), property)
    return takes and not lazy


def autotune(configs: list, key: List[str], prune: Optional[Callable] = None):
    """``triton.autotune(configs=configs, key=key)`` with ``prune`` as its
    ``early_config_prune``, in the form the installed Triton takes; a decorator that
    returns Triton's own ``Autotuner``.

    The key is found by name on Triton 3.2+ and by position among the arguments the caller
    passes on older ones, which is the same position when every argument the
    configurations supply comes after the others in the kernel's signature (the kernels'
    order). On Triton 3.2 / 3.3 the ``Autotuner`` is made directly, with a ``do_bench``
    that asks the driver only when it benchmarks (3.2's ``autotune`` does not pass its
    ``do_bench`` on).
    """
    prune_by = None
    if prune is not None:
        # Triton 2.x reads perf_model and top_k unconditionally
        prune_by = dict(early_config_prune=prune, perf_model=None, top_k=None)
    if not _asks_driver_at_decoration():
        return triton.autotune(configs=configs, key=key, prune_configs_by=prune_by)
    from triton.runtime.autotuner import Autotuner

    def decorator(fn):
        return Autotuner(
            fn,
            fn.arg_names,
            configs,
            key,
            None,
            None,
            prune_configs_by=prune_by,
            do_bench=_driver_benchmark)

    return decorator


#: Options of Triton 3.2's ``Config`` that it passes to every launch unless None, and that
#: its interpreter does not take.
_UNSET_OPTIONS = tuple(
    name for name in ('num_buffers_warp_spec', 'num_consumer_groups', 'reg_dec_producer',
                      'reg_inc_consumer') if name in inspect.signature(triton.Config).parameters)


def make_config(kwargs: dict, num_warps: int, num_stages: int):
    """``triton.Config(kwargs, num_warps=, num_stages=)``, with no other option passed
    to the launch (:data:`_UNSET_OPTIONS`)."""
    unset = dict.fromkeys(_UNSET_OPTIONS)
    return triton.Config(kwargs, num_warps=num_warps, num_stages=num_stages, **unset)


def config_options(config) -> dict:
    """The keyword arguments a launch of ``config`` (a ``triton.Config``) adds: its
    meta-parameters, ``num_warps`` and ``num_stages`` (and on 3.x its other options)."""
    if hasattr(config, 'all_kwargs'):
        return config.all_kwargs()
    return dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)


#: Compiler options every launch of the kernels names: fused multiply-adds (Triton 3.x's
#: default, named so that no environment setting changes them; Triton 2.1's launch takes
#: no such option and always fuses).
LAUNCH_OPTIONS: Dict[str, object] = {'enable_fp_fusion': True} if TRITON_VERSION >= (3, ) else {}

#: Keyword arguments of a launch that are no compiler options (3.x passes them on to the
#: pruning).
_LAUNCH_ONLY = ('grid', 'warmup', 'stream', 'device', 'device_type')


def split_launch(kwargs: dict) -> dict:
    """Of the keyword arguments the autotuner passes to ``early_config_prune`` (none on
    2.x), the compiler options of the launch (``grid``, ``warmup`` and the like dropped)."""
    return {k: v for k, v in kwargs.items() if k not in _LAUNCH_ONLY}


# --------------------------------------------------------------------------------------
# the running GPU
# --------------------------------------------------------------------------------------


def compile_on_device(jit_fn, args: dict, options: dict, config):
    """Compile ``jit_fn`` for the running GPU as a launch of ``config`` with the
    arguments ``args`` (by name, in the signature's order) and compiler ``options`` would
    (Triton caches it for that launch), without launching; returns Triton's compiled
    kernel."""
    return jit_fn.warmup(*args.values(), grid=(1, ), **options, **config_options(config))


def loaded_usage(compiled) -> Usage:
    """Load ``compiled`` (Triton's compiled kernel) on the running GPU and read what it
    uses: registers and local memory per thread from the driver (Triton's ``n_spills``
    is the local memory in 4-byte words: here in bytes, for both spill counts), shared
    memory per block and threads from its metadata. Raises Triton's ``OutOfResources``
    when it needs more shared memory than the GPU has."""
    compiled._init_handles()
    metadata = compiled.metadata
    if isinstance(metadata, dict):  # Triton 2.x
        shared, warps = compiled.shared, compiled.num_warps
    else:
        shared, warps = metadata.shared, metadata.num_warps
    local = 4 * compiled.n_spills
    return Usage(compiled.n_regs, local, local, shared, 32 * warps)


def device_limits() -> Limits:
    """The running GPU's per-block limits from Triton's driver (registers per block from
    the compute capability's limits where the driver does not say them, Triton 2.x)."""
    import torch
    from triton.runtime.driver import driver
    if hasattr(driver, 'active'):  # Triton 3.x
        device = driver.active.get_current_device()
        props = driver.active.utils.get_device_properties(device)
    else:
        device = torch.cuda.current_device()
        props = driver.utils.get_device_properties(device)
    registers = props.get('max_num_regs')
    if not registers:
        major, minor = torch.cuda.get_device_capability(device)
        registers = limits_of(10 * major + minor).registers
    return Limits(shared=props['max_shared_mem'], registers=registers)


# --------------------------------------------------------------------------------------
# named targets, without a GPU
# --------------------------------------------------------------------------------------


def ptxas_path() -> str:
    """The ``ptxas`` bundled with the installed Triton."""
    root = os.path.dirname(triton.__file__)
    if TRITON_VERSION < (3, ):
        return os.path.join(root, 'third_party', 'cuda', 'bin', 'ptxas')
    return os.path.join(root, 'backends', 'nvidia', 'bin', 'ptxas')


@functools.lru_cache(maxsize=None)
def _ptxas_register_flags() -> Tuple[str, ...]:
    """Flags of the installed Triton's ``ptxas`` call that change register allocation
    beyond the defaults (``--regAllocOptLevel=2`` where its ``make_cubin`` passes it)."""
    if TRITON_VERSION < (3, ):
        return ()
    from triton.backends.nvidia.compiler import CUDABackend
    source = inspect.getsource(CUDABackend.make_cubin)
    return ('--regAllocOptLevel=2', ) if '--regAllocOptLevel=2' in source else ()


def _ptxas_flags(fp_fusion: bool, ptx_options: Optional[str]) -> List[str]:
    """The flags the installed Triton passes to ``ptxas`` (its ``make_cubin``), less
    the architecture and the files."""
    flags = ['-lineinfo']
    if not fp_fusion and TRITON_VERSION >= (3, ):
        flags.append('--fmad=false')
    flags.append('-v')
    flags += _ptxas_register_flags()
    if ptx_options:
        flags += ptx_options.split()
    return flags


def target_compile_problem() -> Optional[str]:
    """What the installed Triton lacks to compile for a named target without a GPU, or
    None: its ``triton.compile`` for a ``GPUTarget`` (3.x) or the stages of its
    ``triton.compile`` (2.x), and its bundled ``ptxas``."""
    if TRITON_VERSION >= (3, ):
        try:
            from triton.backends.compiler import GPUTarget  # noqa: F401
            from triton.compiler import ASTSource  # noqa: F401
        except ImportError as error:
            return f'Triton {triton.__version__} has no GPUTarget / ASTSource ({error})'
    else:
        from triton.compiler import compiler
        stages = ('ast_to_ttir', 'optimize_ttir', 'ttir_to_ttgir', 'optimize_ttgir',
                  'ttgir_to_llir', 'llir_to_ptx', 'get_shared_memory_size')
        missing = [name for name in stages if not hasattr(compiler, name)]
        if missing:
            return (f'Triton {triton.__version__} has no compiler stages {", ".join(missing)} '
                    '(Triton 2.1 has them)')
    if not os.access(ptxas_path(), os.X_OK):
        return f'Triton {triton.__version__} has no bundled ptxas at {ptxas_path()}'
    return None


def _ptx_for_target_v2(jit_fn, signature: Dict[str, str], constexprs: Dict[str, object],
                       capability: int, num_warps: int, num_stages: int) -> Tuple[str, int]:
    """Triton 2.x: (PTX, shared memory) through the stages of its ``triton.compile(...,
    cc=)`` up to PTX, run here one by one: that function also builds the launcher, which
    links against the GPU driver's ``libcuda.so``."""
    from triton.compiler import compiler as c
    index = {p.name: i for i, p in enumerate(parameters(jit_fn))}
    sig = {index[k]: v for k, v in signature.items() if v != 'constexpr'}
    constants = {index[k]: v for k, v in constexprs.items()}
    ttir = c.optimize_ttir(
        c.ast_to_ttir(
            jit_fn, sig, c.instance_descriptor(), constants, debug=False, arch=capability),
        capability)
    ttgir = c.optimize_ttgir(c.ttir_to_ttgir(ttir, num_warps), num_stages, capability)
    llir = c.ttgir_to_llir(ttgir, {}, capability)
    shared = c.get_shared_memory_size(ttgir)
    return c.llir_to_ptx(llir, capability), shared


def _ptx_for_target(jit_fn, signature: Dict[str, str], constexprs: Dict[str,
                                                                        object], capability: int,
                    num_warps: int, num_stages: int) -> Tuple[str, int, bool, Optional[str]]:
    """(PTX, shared memory per block, fp fusion, extra ptxas options) of ``jit_fn``
    compiled for sm_``capability`` without a GPU."""
    if TRITON_VERSION < (3, ):
        ptx, shared = _ptx_for_target_v2(jit_fn, signature, constexprs, capability, num_warps,
                                         num_stages)
        return ptx, shared, True, None
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    if 'constexprs' in inspect.signature(ASTSource).parameters:  # Triton 3.3+
        source = ASTSource(fn=jit_fn, signature=dict(signature), constexprs=dict(constexprs))
    else:  # constexprs are 'constants', out of the signature
        source = ASTSource(
            fn=jit_fn,
            signature={
                k: v
                for k, v in signature.items() if v != 'constexpr'
            },
            constants=dict(constexprs))
    compiled = triton.compile(
        source,
        target=GPUTarget('cuda', capability, 32),
        options=dict(num_warps=num_warps, num_stages=num_stages, **LAUNCH_OPTIONS))
    metadata = compiled.metadata
    return (compiled.asm['ptx'], metadata.shared, getattr(metadata, 'enable_fp_fusion', True),
            getattr(metadata, 'ptx_options', None))


def usage_on_target(jit_fn, signature: Dict[str, str], constexprs: Dict[str, object],
                    capability: int, num_warps: int, num_stages: int) -> Usage:
    """Compile ``jit_fn`` for sm_``capability`` without a GPU and read what it uses.

    Args:
        jit_fn: the ``triton.jit`` function.
        signature: every parameter's type, by name: ``'*fp32'``, ``'i32'``, ...,
            ``'constexpr'``.
        constexprs: the compile-time parameters' values, by name.
        capability: e.g. 80 for sm_80.
        num_warps, num_stages: the launch configuration's.

    Returns:
        Usage: registers and spill bytes per thread as the bundled ``ptxas -v`` says them
        (with the flags the installed Triton passes), shared memory per block from
        Triton's metadata, threads per block.
    """
    ptx_text, shared, fp_fusion, ptx_options = _ptx_for_target(jit_fn, signature, constexprs,
                                                               capability, num_warps, num_stages)
    with tempfile.TemporaryDirectory() as folder:
        ptx = os.path.join(folder, 'kernel.ptx')
        with open(ptx, 'w') as f:
            f.write(ptx_text)
        cmd = [
            ptxas_path(), *_ptxas_flags(fp_fusion, ptx_options),
            f'--gpu-name={ptxas_arch(capability)}', ptx, '-o',
            os.path.join(folder, 'kernel.o')
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f'ptxas failed ({proc.returncode}): {proc.stderr[-500:]}')
    registers, stores, loads = parse_ptxas(proc.stderr + proc.stdout)
    return Usage(registers, stores, loads, shared, 32 * num_warps)


# --------------------------------------------------------------------------------------
# the interpreter
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def interpreter_problem() -> Optional[str]:
    """Why Triton's interpreter (``TRITON_INTERPRET=1``, set before Triton was imported)
    cannot run the kernels here, or None (also when it is not asked for): Triton 2.x has
    none; Triton 3.0 / 3.1's interpreter stores nothing with numpy 2 (its compiled
    helpers predate numpy 2's ABI), found by storing one block of ones."""
    if os.environ.get('TRITON_INTERPRET', '0') != '1':
        return None
    if TRITON_VERSION < (3, ):
        return f'Triton {triton.__version__} has no interpreter (TRITON_INTERPRET=1 needs 3.0+)'
    import numpy as np
    import torch
    probe = torch.zeros(16)
    _store_probe[(1, )](probe, 16, 16)
    if not bool((probe == 1).all()):
        return (f'the interpreter of Triton {triton.__version__} writes nothing with numpy '
                f'{np.__version__} (its compiled helpers predate numpy 2: install numpy<2 '
                'beside it, or a Triton >= 3.2)')
    return None


@triton.jit
def _store_probe(X, n, BLOCK: tl.constexpr):
    """Store 1 into X[:n] (the interpreter's check)."""
    offs = tl.arange(0, BLOCK)
    tl.store(X + offs, tl.zeros([BLOCK], dtype=tl.float32) + 1., mask=offs < n)
