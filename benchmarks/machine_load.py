"""How many cores other processes kept busy while a benchmark measured: a figure taken while
someone else used the machine can be told apart (and flagged, or measured again).

This module imports only the standard library and psutil: a benchmark whose child
interpreters must not pay torch's import can use it.

    with OtherLoad() as load:
        measure()
    if (load.cores or 0.0) > DISTURBED_CORES: ...
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil

__all__ = ("DISTURBED_CORES", "OtherLoad", "machine_busy_s", "own_cpu_s")

DISTURBED_CORES = 0.1
"""A sample taken beside more than this many cores of other work is disturbed."""


def machine_busy_s() -> float | None:
    """CPU seconds all processes have spent busy since boot (None where unknown)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of every process it started: its children that ended,
    and those alive with what they reaped (a fork server, the training processes it forked
    for this one, a launcher and its ranks)."""
    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cpu = process.cpu_times()
            total += cpu.user + cpu.system + cpu.children_user + cpu.children_system
    return total


class OtherLoad:
    """Cores other processes kept busy between :meth:`start` and :meth:`stop` (or over a
    ``with`` block: then in :attr:`cores`); None where the machine does not say."""

    def __init__(self) -> None:
        self.cores: float | None = None

    def start(self) -> None:
        self._busy, self._own, self._wall = machine_busy_s(), own_cpu_s(), time.perf_counter()

    def stop(self) -> float | None:
        busy, wall = machine_busy_s(), time.perf_counter() - self._wall
        if busy is None or self._busy is None or wall <= 0:
            return None
        own = own_cpu_s() - self._own
        self.cores = max(0.0, (busy - self._busy - own) / wall)
        return self.cores

    def __enter__(self) -> OtherLoad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
