"""The start method of the package's worker pools (the compile report's compiler processes,
the synthetic data's renderers)."""
import multiprocessing
import threading

__all__ = ['pool_context']


def pool_context():
    """The ``multiprocessing`` context for a pool of workers: fork where the platform has it
    and this process runs one thread (the workers neither re-run the caller's main module
    nor import its libraries again), spawn otherwise, since a fork copies any lock another
    thread (a notebook's, a test runner's) holds at that moment."""
    fork = 'fork' in multiprocessing.get_all_start_methods() and threading.active_count() == 1
    return multiprocessing.get_context('fork' if fork else 'spawn')
