"""Profiling a window of optimizer steps with ``torch.profiler``: one Chrome trace, one operator
table, one ``profile`` record, then nothing. :class:`StepProfiler` is a step hook that lives on
the step thread (the profiler records the thread that started it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from core.checks import is_int
from core.errors import config_error
from core.telemetry.config import check_profile_steps
from core.telemetry.kineto import quiet_first_start

__all__ = ("StepProfiler", "check_profile_steps")

_log = structlog.get_logger("core")


class StepProfiler:
    """After :meth:`start`, skips ``wait`` optimizer steps, warms up on ``warmup`` (traced and
    discarded: they carry the profiler's start-up) and records the next ``active``."""

    def __init__(
        self,
        wait: int,
        warmup: int,
        active: int,
        *,
        emit: Callable[..., None],
        row_limit: int = 20,
    ) -> None:
        check_profile_steps((wait, warmup, active))
        if not (is_int(row_limit) and row_limit >= 1):
            raise config_error("row_limit", row_limit, "an integer >= 1")
        self.wait, self.warmup, self.active = wait, warmup, active
        self.emit = emit
        self.row_limit = row_limit
        self._profiler: profile | None = None
        self._thread: int | None = None
        self._dir: Path | None = None
        self._cuda = False
        self._calls = 0
        self._first_step: int | None = None
        self._last_step: int | None = None
        self._done = False
        self._orphaned = False

    @property
    def running(self) -> bool:
        """Whether a profiler is started and its window not written nor closed."""
        return self._profiler is not None and not self._orphaned

    def start(self, run_dir: Path) -> None:
        """Start profiling on the calling thread (the step thread)."""
        if self._profiler is not None or self._done:
            return
        self._dir = Path(run_dir) / "profile"
        self._cuda = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU]
        if self._cuda:
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(
            activities=activities,
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._write,
            record_shapes=False,
        )
        self._thread = threading.get_ident()
        with self._kineto_starts(0):
            self._profiler.start()

    def next_due(self, step: int) -> int | None:
        """Every step while the profiler runs (``core.loop.schedule``), none after."""
        return None if self._profiler is None else step + 1

    def __call__(self, step: int) -> None:
        """After every optimizer step, with the global step it reached."""
        profiler = self._profiler
        if profiler is None:
            return
        if self._orphaned:  # close() came from another thread: stop here, write nothing
            self._stop()
            return
        index, self._calls = self._calls, self._calls + 1  # the profiler step that ended
        if index == self.wait + self.warmup:
            self._first_step = step
        if index >= self.wait + self.warmup:
            self._last_step = step
        with self._kineto_starts(index + 1):
            profiler.step()  # writes the files (self._write) when the window completes
        if self._done:
            self._stop()

    def _kineto_starts(self, calls: int) -> contextlib.AbstractContextManager[None]:
        """Kineto initialises (with a false alarm) at the call that leaves the wait steps."""
        return quiet_first_start() if calls == self.wait else contextlib.nullcontext()

    def close(self) -> None:
        """Stop a running profiler (idempotent), writing a begun window as far as it got.
        From another thread (where stopping it would crash the process) it only asks the
        step thread to stop it, unwritten, at its next call."""
        if self._profiler is None:
            return
        if threading.get_ident() != self._thread:
            if not self._orphaned:
                _log.warning(
                    "profiler_closed_off_thread",
                    reason="close() was called on another thread than start(); nothing written",
                )
            self._orphaned = True
            return
        self._stop()

    def _stop(self) -> None:
        profiler, self._profiler = self._profiler, None
        self._done = True
        if profiler is not None:
            profiler.stop()  # fires self._write if the window had begun recording

    def _write(self, profiler: profile) -> None:
        self._done = True
        directory = self._dir
        if directory is None or self._first_step is None or self._orphaned:
            return  # closed before a step was recorded, or closed from another thread
        trace, table_file = directory / "trace.json", directory / "top_ops.txt"
        sort_by = "self_cuda_time_total" if self._cuda else "self_cpu_time_total"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(trace))
            table = profiler.key_averages().table(sort_by=sort_by, row_limit=self.row_limit)
            table_file.write_text(table + "\n", encoding="utf-8")
        except (OSError, RuntimeError) as exc:  # a profile is never worth a failed run
            _log.warning(
                "profile_write_failed", path=str(directory), error=f"{type(exc).__name__}: {exc}"
            )
            return
        fields: dict[str, Any] = {
            "trace": str(trace),
            "table_file": str(table_file),
            "first_step": self._first_step,
            "last_step": self._last_step,
            "table": table,
        }
        self.emit("profile", **fields)
