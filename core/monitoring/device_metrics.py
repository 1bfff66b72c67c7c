"""Where a monitor's numbers come from besides NVML (the host through psutil, torch's
allocator), when it samples (a fixed grid, also from a plain thread), and the summary of a
sample history. Every source fills the same :data:`SAMPLE_FIELDS`."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = (
    "HostReader",
    "SAMPLE_FIELDS",
    "SamplingThread",
    "next_tick",
    "spread",
    "summarize",
    "torch_memory",
)

SAMPLE_FIELDS: tuple[str, ...] = (
    "device",
    "source",
    "t_s",
    "util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "throttle_reasons",
    "torch_mem_allocated_bytes",
    "torch_mem_reserved_bytes",
    "torch_max_mem_allocated_bytes",
)
"""The keys of every per-device record, whatever the source (a missing value is None)."""


class HostReader:
    """This process's CPU and memory via psutil, under the GPU field names."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only sets the baseline

    def read(self) -> dict[str, Any]:
        with self._process.oneshot():
            util = self._process.cpu_percent(None)  # since the previous call: never blocks
            rss = self._process.memory_info().rss
        memory = self._psutil.virtual_memory()
        return {
            "util_pct": float(util),
            "mem_util_pct": float(memory.percent),
            "mem_used_bytes": int(rss),
            "mem_total_bytes": int(memory.total),
        }


def torch_memory(index: int | None) -> dict[str, Any]:
    """Allocator counters (host-side bookkeeping: no sync; zeros before CUDA is initialised)."""
    if index is None:
        return {}
    return {
        "torch_mem_allocated_bytes": torch.cuda.memory_allocated(index),
        "torch_mem_reserved_bytes": torch.cuda.memory_reserved(index),
        "torch_max_mem_allocated_bytes": torch.cuda.max_memory_allocated(index),
    }


def summarize(history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    numeric = [f for f in SAMPLE_FIELDS if f not in ("device", "source", "t_s", "throttle_reasons")]
    values: dict[Any, dict[str, list[float]]] = {}
    for sample in history:
        for record in sample["devices"]:
            per_field = values.setdefault(record["device"], {f: [] for f in numeric})
            for field in numeric:
                value = record[field]
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    per_field[field].append(value)
    devices: dict[Any, dict[str, float | None]] = {}
    for device, per_field in values.items():
        devices[device] = {}
        for field, xs in per_field.items():
            devices[device] |= spread(field, xs)
    return {"samples": len(history), "devices": devices}


def spread(name: str, xs: Sequence[float]) -> dict[str, float | None]:
    """``<name>_mean``, ``<name>_max`` and ``<name>_min`` of ``xs`` (None when empty)."""
    mean = sum(xs) / len(xs) if xs else None
    return {
        f"{name}_mean": mean,
        f"{name}_max": max(xs, default=None),
        f"{name}_min": min(xs, default=None),
    }


def next_tick(start: float, tick: int, interval: float, now: float) -> tuple[int, float]:
    """The next tick of the grid ``start + k * interval`` after ``now``, and the wait for it.

    Ticks sit on a fixed grid, so time spent sampling does not add up into drift; a sample
    that overran its slot skips the ticks it missed instead of bursting to catch up.
    """
    tick = max(tick + 1, math.floor((now - start) / interval) + 1)
    return tick, start + tick * interval - now


class SamplingThread(threading.Thread):
    """Background sampling for synchronous callers (``start_monitoring``), on
    the same fixed grid as the coroutine; calls ``close`` when stopped."""

    def __init__(
        self,
        sample: Callable[[], object],
        close: Callable[[], None],
        clock: Callable[[], float],
        interval: float,
    ) -> None:
        super().__init__(name="core-gpu-monitor", daemon=True)
        self._sample, self._close, self._clock, self.interval = sample, close, clock, interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        start, tick = self._clock(), 0
        try:
            while not self._stop_event.is_set():
                self._sample()
                tick, delay = next_tick(start, tick, self.interval, self._clock())
                self._stop_event.wait(delay)
        finally:
            self._close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
