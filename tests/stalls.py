"""Where the event loop's thread was while a workload ran beside it: a stall detector.

::

    async with watch_loop() as watch:
        await workload()
    assert watch.longest_in_core().duration_s < 0.05, watch.summary()

Two things run beside the workload on the running loop (asyncio or trio):

- a heartbeat coroutine that sleeps toward deadlines ``period_s`` apart and records how late
  each wake is (``watch.lateness_s``);
- a sampler thread that, every ``interval_s``, takes the loop thread's Python stack
  (``sys._current_frames()``) and notes the innermost frame in ``core/``.

From the samples come *stretches in core*: runs of consecutive samples that found the loop
thread inside the same call of ``core`` code (the same outermost ``core`` frame). A stretch
lasts from its first sample to the first sample that no longer finds it, so a call that
holds the GIL (the sampler cannot look meanwhile) counts whole. A loop waiting in its
selector is never in ``core``: a suspended coroutine is not on the thread's stack. Unlike
lateness, a stretch says where work runs, not how busy the machine is: a test may assert
on it. Late beats (over ``late_s``) are charged to the samples taken while they were due.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import FrameType

import anyio
import anyio.abc

import core

__all__ = ("LoopWatch", "Stretch", "watch_loop")

CORE_DIR = os.path.dirname(core.__file__) + os.sep  # as code objects name their files


@dataclass(frozen=True)
class Sample:
    at: float
    """``perf_counter()`` when the stack was taken."""
    call: int | None
    """Identity of the outermost ``core`` frame (None: the loop thread was not in core)."""
    where: str = ""
    """The innermost ``core`` frame, ``core/file.py:function:line``."""
    leaf: str = ""
    """The innermost frame overall."""


@dataclass(frozen=True)
class Stretch:
    """One call of ``core`` code seen on the loop thread by consecutive samples."""

    start_s: float
    duration_s: float
    """From the first sample that saw it to the first that did not (an upper bound)."""
    samples: int
    where: Counter[str]
    """Innermost ``core`` frame -> samples that found it there."""
    leaf: str

    def __str__(self) -> str:
        top = ", ".join(f"{w} x{n}" for w, n in self.where.most_common(3))
        seen = f"{1000 * self.duration_s:.1f} ms in core ({self.samples} samples)"
        return f"{seen}: {top}; leaf {self.leaf}"


def _key(frame: FrameType) -> str:
    code = frame.f_code
    name = code.co_filename
    short = "core/" + name[len(CORE_DIR) :] if name.startswith(CORE_DIR) else os.path.basename(name)
    return f"{short}:{code.co_name}:{frame.f_lineno}"


@dataclass
class LoopWatch:
    """The heartbeat's lateness and the sampler's view of the loop thread."""

    period_s: float = 0.003
    interval_s: float = 0.002
    late_s: float = 0.02
    loop_thread: int = 0
    deadlines: list[float] = field(default_factory=list)
    lateness_s: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    # -- the two observers ----------------------------------------------------------------
    async def beat(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        deadline = time.perf_counter() + self.period_s
        task_status.started()
        while True:
            await anyio.sleep(max(0.0, deadline - time.perf_counter()))
            now = time.perf_counter()
            self.deadlines.append(deadline)
            self.lateness_s.append(now - deadline)
            deadline = max(deadline + self.period_s, now)  # one long stall is one late beat

    def sample(self) -> None:
        frames = sys._current_frames
        while not self._stop.wait(self.interval_s):
            frame = frames().get(self.loop_thread)
            now = time.perf_counter()
            if frame is None:
                continue
            outer: FrameType | None = None
            inner: FrameType | None = None
            current: FrameType | None = frame
            while current is not None:
                if current.f_code.co_filename.startswith(CORE_DIR):
                    outer = current
                    inner = inner or current
                current = current.f_back
            if outer is None or inner is None:
                self.samples.append(Sample(now, None, leaf=_key(frame)))
            else:
                self.samples.append(Sample(now, id(outer), _key(inner), _key(frame)))
            del frame, current, outer, inner

    # -- what they saw --------------------------------------------------------------------
    def stretches(self) -> list[Stretch]:
        """Every stretch in core, in order."""
        out: list[Stretch] = []
        run: list[Sample] = []
        for sample in [*self.samples, Sample(math.inf, None)]:
            if run and sample.call != run[0].call:
                end = sample.at if sample.at != math.inf else run[-1].at
                where = Counter(s.where for s in run)
                out.append(Stretch(run[0].at, end - run[0].at, len(run), where, run[-1].leaf))
                run = []
            if sample.call is not None:
                run.append(sample)
        return out

    def longest_in_core(self) -> Stretch | None:
        return max(self.stretches(), key=lambda s: s.duration_s, default=None)

    def late_beats(self) -> list[tuple[float, Counter[str]]]:
        """Beats later than ``late_s``: (lateness, where the loop thread was while it was
        due: the innermost ``core`` frame, or ``(outside core) <leaf>``)."""
        out = []
        for deadline, late in zip(self.deadlines, self.lateness_s, strict=True):
            if late <= self.late_s:
                continue
            seen = Counter(
                s.where or f"(outside core) {s.leaf}"
                for s in self.samples
                if deadline <= s.at <= deadline + late
            )
            out.append((late, seen))
        return out

    def summary(self, top: int = 8) -> str:
        ms = sorted(1000 * x for x in self.lateness_s) or [math.nan]
        lines = [
            f"{len(self.lateness_s)} beats, p99 {ms[max(0, math.ceil(0.99 * len(ms)) - 1)]:.1f} "
            f"ms, worst {ms[-1]:.1f} ms; {len(self.samples)} samples of the loop thread",
            "longest stretches in core:",
        ]
        longest = sorted(self.stretches(), key=lambda s: s.duration_s, reverse=True)
        lines += [f"  {s}" for s in longest[:top]]
        lines.append(f"beats later than {1000 * self.late_s:g} ms:")
        for late, seen in sorted(self.late_beats(), key=lambda b: b[0], reverse=True)[:top]:
            lines.append(f"  {1000 * late:.1f} ms: {dict(seen.most_common(3))}")
        return "\n".join(lines)


@contextlib.asynccontextmanager
async def watch_loop(
    *, period_s: float = 0.003, interval_s: float = 0.002, late_s: float = 0.02
) -> AsyncIterator[LoopWatch]:
    """Run the heartbeat and the sampler beside the body, on the running event loop."""
    watch = LoopWatch(period_s, interval_s, late_s, threading.get_ident())
    sampler = threading.Thread(target=watch.sample, name="loop-sampler", daemon=True)
    sampler.start()
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(watch.beat)
            try:
                yield watch
            finally:
                tg.cancel_scope.cancel()
    finally:
        watch._stop.set()
        sampler.join()
