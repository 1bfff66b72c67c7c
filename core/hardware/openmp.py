"""Keeping CPU work in the step thread as fast as in the main thread (libgomp).
:func:`release_thread_pool` frees the event loop thread's OpenMP pool before work is handed to
the step thread. Other OpenMP runtimes are left alone.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

__all__ = ("release_thread_pool",)

_OMP_PAUSE_SOFT = 1


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    for line in maps.read_text().splitlines():
        path = line.split()[-1]
        if "libgomp" in Path(path).name:
            try:
                # Called holding the interpreter lock (a PyDLL), for at most ~0.2 ms: released
                # and taken back, the lock would cost the event loop's thread a switch
                # interval (5 ms) whenever training threads hold it.
                lib = ctypes.PyDLL(path)  # already loaded: returns the same instance
            except OSError:
                return None
            return lib if hasattr(lib, "omp_pause_resource_all") else None
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's libgomp pool (recreated on its next parallel region).

    Returns True if a libgomp runtime was found and accepted the request.
    """
    # Every thread running a parallel torch op owns a pool, and libgomp throttles its workers'
    # spin-wait (~1,000 spins, not ~300,000) once it manages more threads than CPUs: with two
    # pools each parallel region hands off to sleeping workers (a small MLP's step on 2 cores:
    # 2.8 ms in a worker thread, 1.1 ms in the main thread). omp_pause_resource_all frees the
    # calling thread's pool.
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0
