"""Peak memory of one measurement: the process's resident memory (CPU) or the CUDA
caching allocator's allocated memory.

* :class:`CpuMemory`: the peak resident memory of the process during the measurement
  minus its resident memory right before it ("RSS delta": activations, gradients,
  workspace) and the absolute peak ("max RSS": libraries, weights and input included).
  The peak is the kernel's high-water mark (``VmHWM``), reset before the measurement where
  Linux allows it (``/proc/self/clear_refs``), else ``getrusage`` (the whole process's
  peak): meaningful for a process that runs one measurement, as
  :func:`polaformer_mm.analysis.benchmark.run_isolated` does.
* :class:`CudaMemory`: ``torch.cuda.max_memory_allocated`` after a reset, minus the memory
  allocated right before the measurement ("alloc delta"), and the absolute peak ("max
  alloc").

Both are used as ``probe.start()``, the measurement, ``probe.stop()`` (a dict of
``mem_peak_mib``, ``mem_delta_mib`` and ``mem_method``).

:func:`limit_resident_memory` caps a CPU measuring process near a resident size (a
machine's memory), so that a measurement that would not fit fails with an allocation
error instead of swapping or meeting the kernel's OOM killer.
"""
from typing import Optional

import torch

__all__ = ['CpuMemory', 'CudaMemory', 'memory_note', 'limit_resident_memory', 'is_out_of_memory']

MEMORY_NOTES = {
    'cpu': ('RSS delta = peak resident memory of the measuring process during the '
            'measurement minus its resident memory right before it; max RSS = that '
            'peak (libraries, weights and input included)'),
    'cuda': ('alloc delta = torch.cuda.max_memory_allocated during the measurement minus '
             'the memory allocated right before it; max alloc = that peak'),
}

IN_PROCESS_CPU_NOTE = (
    '. CAUTION: --isolate none on CPU: all measurements share one process, so after the '
    'first the memory figures count only growth beyond what the process already holds')


def memory_note(device_type: str, isolate: str) -> str:
    """What the memory figures of measurements on ``device_type`` ('cpu' or 'cuda') mean,
    with a caution for CPU measurements that share one process (``isolate`` 'none')."""
    return MEMORY_NOTES[device_type] + (
        IN_PROCESS_CPU_NOTE if device_type == 'cpu' and isolate == 'none' else '')


def _read_status_kib(field: str) -> Optional[int]:
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(field + ':'):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark to the current RSS (Linux >= 4.0)."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        return False
    return True


def _peak_rss_kib() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def limit_resident_memory(gib: float) -> int:
    """Limit this process so that its resident memory cannot grow past about ``gib`` GiB:
    the address-space limit (``RLIMIT_AS``) is set to the current address space plus
    ``gib`` GiB minus the current resident memory (mapped libraries that are not resident
    count in the address space only; memory torch allocates for tensors is touched, so
    it counts in both). An allocation past it fails (torch: ``RuntimeError ... can't
    allocate memory``). Returns the limit in bytes. Linux only."""
    import resource
    size, rss = _read_status_kib('VmSize'), _read_status_kib('VmRSS')
    if size is None or rss is None:
        raise RuntimeError('a memory limit needs /proc/self/status (Linux)')
    limit = int((size - rss) * 1024 + gib * 2**30)
    if limit <= size * 1024:
        raise RuntimeError(f'memory limit {gib} GiB: the process already holds '
                           f'{rss / 2**20:.2f} GiB')
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)  # a soft limit may not exceed the hard one
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit


_OOM_TEXT = ('out of memory', "can't allocate memory", 'cannot allocate memory', 'bad_alloc')


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (CUDA or CPU)."""
    return (isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError))
            or any(t in str(exc).lower() for t in _OOM_TEXT))


class CpuMemory:
    """Peak resident memory of this process (see the module's docstring)."""
    kind = 'cpu-rss'

    def start(self):
        """Reset the peak and note the resident memory before the measurement."""
        self.before = _read_status_kib('VmRSS')
        self.method = 'VmHWM after reset' if (_reset_peak_rss() and self.before
                                              and _read_status_kib('VmHWM')) else 'ru_maxrss'
        if self.before is None:  # no /proc: resident size unknown before the run
            self.before = _peak_rss_kib()

    def stop(self) -> dict:
        """The peak since :meth:`start`, absolute and over the memory before it (MiB)."""
        peak = (_read_status_kib('VmHWM') if self.method.startswith('VmHWM') else _peak_rss_kib())
        return dict(
            mem_peak_mib=peak / 1024,
            mem_delta_mib=(peak - self.before) / 1024,
            mem_method=self.method)


class CudaMemory:
    """Peak memory allocated by torch on a CUDA ``device``."""
    kind = 'cuda-allocated'

    def __init__(self, device):
        self.device = device

    def start(self):
        """Reset the peak and note the memory allocated before the measurement."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.before = torch.cuda.memory_allocated(self.device)

    def stop(self) -> dict:
        """The peak since :meth:`start`, absolute and over the memory before it (MiB)."""
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        return dict(
            mem_peak_mib=peak / 2**20,
            mem_delta_mib=(peak - self.before) / 2**20,
            mem_method='torch.cuda.max_memory_allocated')
