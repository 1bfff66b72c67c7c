"""Cancellation storms in one service: whatever moment a cancellation lands on, nothing
outlives a cancelled ``train()``.

- ``storm``: ``--jobs`` trainings started in one service (all at once, then with their
  ``train()`` calls spread at random over ``--spread-s`` seconds), ``--process-jobs`` of
  them in training processes and the rest in threads, each cancelled at a random moment
  0-1 s after its ``train()`` was called, in one of three native forms taken in turn
  (``task.cancel()``, ``asyncio.wait_for``'s timeout, ``asyncio.timeout``). One second after
  the last ``train()`` returned: the service's training processes still alive (goal: none),
  the runs that reached their first step and how many of them have a stop checkpoint at
  their last step (goal: all), and the service's open file descriptors, threads and RSS
  against where they started (goal: back within noise).
- ``series``: ``--trainings`` process-mode trainings one after another in one service,
  ``--parallel`` at a time, each cancelled at a random moment 0-0.5 s after ``train()``: the
  same figures after every wave, printed at the start, each quarter and the end (goal: flat).

Each training is small (a 2-layer MLP, a loader pacing 5 ms a batch, 400 steps an epoch), so
that most cancellations land while a run starts or steps, and the storm fits a 2-core CPU.
The reports a run draws at its end are off (``reports=False``): their processes are not the
service's trainings. Threads are counted with and without anyio's idle worker threads
(a pool that keeps idle workers, let go when it is next used after 10 s idle). RSS is
read as it is, then once the C allocator has returned its free memory (``malloc_trim``).

    python -m benchmarks.cancel_storm                   # both parts
    python -m benchmarks.cancel_storm --parts storm --jobs 50 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime
import gc
import json
import multiprocessing.forkserver
import os
import platform
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from core import (
    CheckpointConfig,
    LoggingConfig,
    OptimizedTrainingOptimizer,
    RunConfig,
    TrainingConfig,
)

FORMS = ("task.cancel", "wait_for", "asyncio.timeout")
_ANYIO_WORKER = "AnyIO worker thread"


class Paced:
    """A loader of ``steps`` batches of 16 samples, ``delay_s`` each (module level: it crosses
    into a training process)."""

    def __init__(self, steps: int = 400, delay_s: float = 0.005) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(steps * 16, 16, generator=g)
        self.y = (self.x[:, 0] > 0).long()
        self.steps, self.delay_s = steps, delay_s

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.steps):
            time.sleep(self.delay_s)
            yield self.x[i * 16 : (i + 1) * 16], self.y[i * 16 : (i + 1) * 16]


def job(root: Path, name: str, isolation: str, steps: int = 400) -> OptimizedTrainingOptimizer:
    torch.manual_seed(0)
    config = TrainingConfig(
        run=RunConfig(
            experiment_name=name,
            log_dir=root,
            max_epochs=2,
            seed=0,
            isolation=isolation,  # type: ignore[arg-type]
        ),
        checkpoint=CheckpointConfig(save_on_cancel=True),
        logging=LoggingConfig(progress=False, reports=False),
    )
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 2))
    return OptimizedTrainingOptimizer(config, model=model, train_loader=Paced(steps))


async def cancelled(train: Any, form: str, after_s: float) -> None:
    """``train`` (a coroutine) cancelled ``after_s`` after it was called, in ``form``."""
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        if form == "wait_for":
            await asyncio.wait_for(train, after_s)
        elif form == "asyncio.timeout":
            async with asyncio.timeout(after_s):
                await train
        else:
            task = asyncio.ensure_future(train)
            await asyncio.sleep(after_s)
            task.cancel()
            await task


@dataclass(frozen=True)
class Snapshot:
    """The service's resources at one moment."""

    fds: int
    pidfds: int
    threads: int
    busy_threads: int
    rss_mb: float
    trimmed_mb: float
    alive: int

    @classmethod
    def now(cls) -> Snapshot:
        targets = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        names = [t.name for t in threading.enumerate()]
        return cls(
            fds=len(targets),
            pidfds=sum(t == "anon_inode:[pidfd]" for t in targets),
            threads=len(names),
            busy_threads=sum(not n.startswith(_ANYIO_WORKER) for n in names),
            rss_mb=rss_mb(),
            trimmed_mb=trim_malloc(),
            alive=len(training_processes()),
        )

    def row(self, label: str) -> str:
        return (
            f"| {label} | {self.fds} | {self.pidfds} | {self.busy_threads} ({self.threads}) "
            f"| {self.rss_mb:.0f} ({self.trimmed_mb:.0f}) | {self.alive} |"
        )


COLUMNS = (
    "open fds",
    "pidfds",
    "threads (with anyio's idle pool)",
    "RSS MB (after malloc_trim)",
    "alive",
)
"""``alive``: the service's training processes still running."""


def header(first: str) -> None:
    print("| " + " | ".join((first, *COLUMNS)) + " |")
    print("|" + " --- |" * (len(COLUMNS) + 1))


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss / 2**20)


def trim_malloc() -> float:
    """RSS once the C allocator (glibc) has returned its free memory to the system: memory
    in use, not freed memory the allocator keeps for later."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb()


def training_processes() -> list[psutil.Process]:
    """The service's processes still running (not zombies), its fork server and
    ``multiprocessing``'s resource tracker apart: its training processes and what they left."""
    server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    alive = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.pid == server or "resource_tracker" in " ".join(process.cmdline()):
                continue
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def stepped_and_saved(root: Path, name: str) -> tuple[bool, bool]:
    """Whether the run of experiment ``name`` reached its first step, and whether it then
    ended with a checkpoint of its last step, on disk (its ``run_end`` and ``checkpoint``
    records)."""
    runs = list((root / name).glob("*/events.jsonl"))
    if not runs:
        return False, False
    records = [json.loads(line) for line in runs[0].read_text().splitlines()]
    end = records[-1]
    steps = end.get("global_step", 0) if end.get("event") == "run_end" else 0
    if steps == 0:
        return False, False
    saved = {r["path"]: r["step"] for r in records if r["event"] == "checkpoint"}
    last = end.get("last_checkpoint")
    return True, last in saved and saved[last] == steps and Path(last).is_dir()


async def warm_up(root: Path) -> None:
    """A short training to its end in each mode: the fork server up, first-use imports paid."""
    for isolation in ("process", "thread"):
        await job(root, f"warm-{isolation}", isolation, steps=20).train()


def outcome_table(plan: list[tuple[str, str]], root: Path) -> None:
    """Per mode: the jobs, those that reached a step, those with a stop checkpoint of it."""
    outcomes = [(mode, *stepped_and_saved(root, name)) for name, mode in plan]
    print("| mode | jobs | reached a step | with the stop checkpoint of that step |")
    print("| --- | --- | --- | --- |")
    for mode in ("process", "thread"):
        mine = [o for o in outcomes if o[0] == mode]
        if mine:
            stepped = sum(o[1] for o in mine)
            print(f"| {mode} | {len(mine)} | {stepped} | {sum(o[1] and o[2] for o in mine)} |")


async def storm(args: argparse.Namespace, root: Path, spread_s: float) -> None:
    rng = random.Random(args.seed)
    await warm_up(root)
    gc.collect()
    start = Snapshot.now()
    modes = ["process"] * args.process_jobs + ["thread"] * (args.jobs - args.process_jobs)
    rng.shuffle(modes)
    plan = [
        (f"storm-{i}", mode, FORMS[i % 3], rng.uniform(0.0, spread_s), rng.uniform(0.0, 1.0))
        for i, mode in enumerate(modes)
    ]
    began = time.monotonic()
    returned: list[float] = []

    async def one(name: str, mode: str, form: str, at_s: float, after_s: float) -> None:
        await asyncio.sleep(at_s)
        await cancelled(job(root, name, mode).train(), form, after_s)
        returned.append(time.monotonic() - began)

    peak = Snapshot.now()
    async with asyncio.TaskGroup() as tg:
        for planned in plan:
            tg.create_task(one(*planned))
        while len(returned) < len(plan):
            await asyncio.sleep(0.05)
            now = Snapshot.now()
            if now.alive > peak.alive:
                peak = now
    await asyncio.sleep(1.0)  # the goal's second after the last train() returned
    gc.collect()
    after = Snapshot.now()
    await asyncio.sleep(10.0)
    gc.collect()
    later = Snapshot.now()
    started = "all at once" if spread_s == 0 else f"spread over {spread_s:g} s"
    print(f"\n### storm: {args.jobs} jobs ({args.process_jobs} process) started {started}")
    print(f"each cancelled 0-1 s after its train(); the last returned {max(returned):.1f} s in\n")
    outcome_table([(name, mode) for name, mode, *_ in plan], root)
    print()
    header("when")
    print(start.row("before the storm"))
    print(peak.row("most training processes alive"))
    print(after.row("1 s after the last train() returned"))
    print(later.row("11 s after"))


async def series(args: argparse.Namespace, root: Path) -> None:
    rng = random.Random(args.seed + 1)
    await warm_up(root)
    gc.collect()
    marks = [args.trainings * k // 4 for k in range(1, 5)]
    rows = [("0", Snapshot.now())]
    done = 0
    while done < args.trainings:
        wave = range(done, min(done + args.parallel, args.trainings))
        async with asyncio.TaskGroup() as tg:
            for i in wave:
                train = job(root, f"series-{i}", "process").train()
                tg.create_task(cancelled(train, FORMS[i % 3], rng.uniform(0.0, 0.5)))
        done = wave.stop
        if done >= marks[0]:
            marks.pop(0)
            await asyncio.sleep(1.0)  # as in the storm: 1 s after the wave's train() returned
            gc.collect()
            rows.append((str(done), Snapshot.now()))
    print(f"\n### series: {args.trainings} process-mode trainings, {args.parallel} at once,")
    print("each cancelled 0-0.5 s after its train()\n")
    outcome_table([(f"series-{i}", "process") for i in range(args.trainings)], root)
    print()
    header("trainings done")
    for label, snapshot in rows:
        print(snapshot.row(label))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts", nargs="+", choices=("storm", "series"), default=["storm", "series"]
    )
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument(
        "--spread-s",
        type=float,
        nargs="+",
        default=[0.0, 10.0],
        help="a storm for each: its train() calls spread at random over that many seconds",
    )
    parser.add_argument("--process-jobs", type=int, default=35)
    parser.add_argument("--trainings", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        f"{datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, load average "
        f"{os.getloadavg()[0]:.1f} at the start"
    )
    with tempfile.TemporaryDirectory(prefix="core-cancel-storm-") as tmp:
        if "storm" in args.parts:
            for spread_s in args.spread_s:
                asyncio.run(storm(args, Path(tmp) / f"storm-{spread_s:g}", spread_s))
        if "series" in args.parts:
            asyncio.run(series(args, Path(tmp) / "series"))


if __name__ == "__main__":
    main()
