"""Event-loop latency while trainings run in it: how late a 5 ms heartbeat wakes.

A heartbeat coroutine sleeps until deadlines ``--period-ms`` apart and records how late it
wakes (actual wake time minus deadline). It runs beside each workload, from the workload's
start to its end, in these scenarios (each in a fresh process, so every training scenario
includes a service's first job start):

- ``alone``: the heartbeat alone for ``--duration`` seconds;
- ``train:K``: K concurrent training jobs of the email-sequence example (CPU), each built
  inside the event loop, as a service would (``--build async``: the ``async with`` resource,
  built in a worker thread; ``--build factory``: the synchronous seed factory), then
  ``await job.train()``; job start, ``--epochs`` epochs and every epoch end (validation,
  checkpoint) fall inside the measured window;
- ``process:K``: the same K trainings with ``isolation="process"``: each trains in a child
  process and this event loop only relays its records (a process start included);
- ``torch:K``: the control, K bare PyTorch loops (same model, data and optimizer, no
  ``core``), each in a thread, for ``--duration`` seconds. Lateness here is what the GIL and
  the CPU cost any event loop beside a training thread: it bounds what ``core`` can reach.

Prints p50 / p99 / worst lateness and the number of beats per scenario (alone, the floor is
about 1 ms: epoll's timeout is in whole milliseconds); for trainings also
the same over the beats due after the jobs were built (job start left out). ``--warm-up``
runs a short job first in each training scenario's process (a warm service: first-use
imports paid before the window). The "other" column is how many cores other processes kept
busy during the scenario (from ``/proc/stat``): a figure taken beside someone else's work is
flagged, and ``--retries N`` runs such a scenario again.

    python -m benchmarks.responsiveness                      # every scenario, two trainings
    python -m benchmarks.responsiveness --trace-stalls       # and what blocked the loop
    python -m benchmarks.responsiveness --scenarios train:2 --epochs 6 --json out.json

``--trace-stalls`` adds a sampler thread that, whenever the heartbeat is more than
``--stall-threshold-ms`` late, captures the event loop thread's Python stack and charges the
time to its innermost frame in ``core`` (and to the innermost frame overall). With
``--asyncio-debug`` it also turns asyncio's debug mode on, ``slow_callback_duration`` at the
same threshold, and collects the callbacks asyncio reports as slow (debug mode records a
traceback for every scheduled callback, which costs the loop thread itself). Tracing
perturbs the timings: use the plain run for the figures and the traced run for the causes.
A stall charged to a frame outside ``core`` whose innermost frame is the loop's own
``select`` means the loop thread was ready to run but had to wait for the GIL or a core; the
``torch:K`` control shows how much of that a bare training thread causes on its own.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import math
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import torch
from torch import nn
from torch.utils.data import DataLoader

import core
from benchmarks.machine_load import DISTURBED_CORES, OtherLoad
from core import (
    OptimConfig,
    OptimizedTrainingOptimizer,
    RunConfig,
    TrainingConfig,
    create_optimized_training_optimizer,
)
from examples.email_sequence import EmailSequenceDataset, EmailSequenceModel

ROOT = Path(__file__).resolve().parents[1]
CORE_DIR = os.path.dirname(core.__file__) + os.sep  # as code objects name their files
GOAL_P99_MS = 5.0
GOAL_WORST_MS = 20.0
_SPEC = re.compile(r"^(alone|train|process|torch)(?::(\d+))?$")


# -- the heartbeat ----------------------------------------------------------------------------
@dataclass
class Heartbeat:
    """Sleeps toward deadlines ``period_s`` apart and records how late each wake is.

    Deadlines missed entirely (a stall longer than a period) are skipped, not caught up
    in a burst: one long stall is one late beat, and ``missed`` counts the skipped ones.
    """

    period_s: float
    deadlines: list[float] = field(default_factory=list)
    lateness_s: list[float] = field(default_factory=list)
    missed: int = 0
    deadline: float | None = None
    """The pending deadline (``perf_counter`` clock), read by the stall sampler."""

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        deadline = time.perf_counter() + self.period_s
        self.deadline = deadline
        task_status.started()
        try:
            while True:
                await anyio.sleep(max(0.0, deadline - time.perf_counter()))
                now = time.perf_counter()
                self.deadlines.append(deadline)
                self.lateness_s.append(now - deadline)
                deadline += self.period_s
                if now >= deadline:
                    skipped = math.floor((now - deadline) / self.period_s) + 1
                    self.missed += skipped
                    deadline += skipped * self.period_s
                self.deadline = deadline
        finally:
            self.deadline = None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def latency_summary(lateness_s: Sequence[float], missed: int | None) -> dict[str, Any]:
    ms = sorted(1000 * x for x in lateness_s)
    return {
        "beats": len(ms),
        **({} if missed is None else {"missed_beats": missed}),
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "worst_ms": round(ms[-1], 3) if ms else math.nan,
        "over_5ms": sum(x > 5 for x in ms),
        "over_20ms": sum(x > 20 for x in ms),
    }


# -- stall tracing ----------------------------------------------------------------------------
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + os.sep


def short_path(filename: str) -> str:
    """A file name short enough to read: relative to the checkout, site-packages or stdlib."""
    path = str(Path(filename).resolve()) if os.path.isabs(filename) else filename
    root = str(ROOT) + os.sep
    if path.startswith(root) and ".venv" not in path:
        return path[len(root) :]
    if "site-packages" + os.sep in path:
        return path.split("site-packages" + os.sep, 1)[1]
    if path.startswith(_STDLIB):
        return path[len(_STDLIB) :]
    return filename


def most_first(seconds_by: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(seconds_by.items(), key=lambda item: item[1], reverse=True)


@functools.cache
def _short(filename: str) -> str:
    return short_path(filename)


def frame_key(frame: FrameType) -> str:
    code = frame.f_code
    return f"{_short(code.co_filename)}:{code.co_name}:{frame.f_lineno}"


class StallSampler:
    """A thread that samples the event loop thread's stack while the heartbeat is late.

    Every ``interval_s`` it checks the heartbeat's pending deadline; past ``threshold_s``
    it takes the loop thread's stack (``sys._current_frames()``) and charges the time
    since its previous look (only the part beyond the threshold) to the innermost frame
    in ``core`` and to the innermost frame overall.
    """

    def __init__(
        self, beat: Heartbeat, loop_thread: int, threshold_s: float, interval_s: float = 0.001
    ) -> None:
        self.beat = beat
        self.loop_thread = loop_thread
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self.stalled_s: defaultdict[tuple[str, str], float] = defaultdict(float)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="stall-sampler", daemon=True)

    def __enter__(self) -> StallSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            now = time.perf_counter()
            deadline = self.beat.deadline
            if deadline is None or now - deadline < self.threshold_s:
                last = now
                continue
            frame = sys._current_frames().get(self.loop_thread)
            charged = now - max(last, deadline + self.threshold_s)
            last = now
            if frame is not None and charged > 0:
                self.stalled_s[self._where(frame)] += charged
                self.samples += 1

    @staticmethod
    def _where(frame: FrameType) -> tuple[str, str]:
        """The innermost frame in core, and the innermost frame overall (or, inside an
        import, the module whose import the first frame above it started). No source line
        is read: the sampler holds the GIL only as long as walking the stack takes."""
        leaf = frame_key(frame)
        importing: str | None = None
        current: FrameType | None = frame
        while current is not None:
            code = current.f_code
            if code.co_filename.startswith(CORE_DIR):
                return frame_key(current), importing or leaf
            if code.co_name == "_find_and_load" and "importlib" in code.co_filename:
                importing = f"import {current.f_locals.get('name')}"
            current = current.f_back
        return "(outside core)", importing or leaf

    def report(self) -> dict[str, Any]:
        total = sum(self.stalled_s.values())
        by_function: defaultdict[str, float] = defaultdict(float)
        leaves: defaultdict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
        lines: defaultdict[str, float] = defaultdict(float)
        for (where, leaf), seconds in self.stalled_s.items():
            function = where if where == "(outside core)" else where.rsplit(":", 1)[0]
            by_function[function] += seconds
            lines[where] += seconds
            leaves[where][leaf] += seconds

        def rows(seconds_by: dict[str, float], with_leaf: bool) -> list[dict[str, Any]]:
            out = []
            for key, seconds in most_first(seconds_by):
                row: dict[str, Any] = {
                    "where": key,
                    "stalled_ms": round(1000 * seconds, 1),
                    "share": round(seconds / total, 4) if total else 0.0,
                }
                if with_leaf:
                    row["top_leaves"] = [
                        {"leaf": leaf, "stalled_ms": round(1000 * s, 1)}
                        for leaf, s in most_first(leaves[key])[:3]
                    ]
                out.append(row)
            return out

        return {
            "threshold_ms": 1000 * self.threshold_s,
            "stalled_ms": round(1000 * total, 1),
            "samples": self.samples,
            "by_function": rows(by_function, with_leaf=False),
            "by_line": rows(lines, with_leaf=True),
        }


class SlowCallbacks(logging.Handler):
    """Collects asyncio debug mode's "Executing <handle> took N seconds" warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.count: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if not (isinstance(record.msg, str) and record.msg.startswith("Executing")):
            return
        if not (isinstance(record.args, tuple) and len(record.args) == 2):
            return
        handle, seconds = record.args
        key = describe_handle(repr(handle))
        self.seconds[key] += float(seconds) if isinstance(seconds, (int, float)) else 0.0
        self.count[key] += 1

    def report(self) -> list[dict[str, Any]]:
        return [
            {"callback": key, "count": self.count[key], "total_ms": round(1000 * s, 1)}
            for key, s in most_first(self.seconds)
        ]


def describe_handle(text: str) -> str:
    """A short, stable name for an asyncio handle's repr: the task's name (anyio names a
    task after its function) and where its coroutine stopped next, or the callback."""
    name = re.search(r"<Task \w+ name='([^']*)'", text)
    where = re.search(r"running at (\S+?):(\d+)>", text)
    if name:
        at = f" (next stop {short_path(where.group(1))}:{where.group(2)})" if where else ""
        return f"task {name.group(1)}{at}"
    handle = re.search(r"<(?:Timer)?Handle (?:when=\S+ )?([^\s(]+)", text)
    if handle:
        return f"callback {handle.group(1)}"
    return text[:120]


# -- workloads --------------------------------------------------------------------------------
Workload = Callable[[], Awaitable[list[dict[str, Any]]]]


@dataclass
class Data:
    train: EmailSequenceDataset
    val: EmailSequenceDataset


def build_data(args: argparse.Namespace) -> Data:
    return Data(
        EmailSequenceDataset(args.train_samples, seed=0),
        EmailSequenceDataset(args.val_samples, seed=1),
    )


def build_model(data: Data, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return EmailSequenceModel(
        vocab_size=data.train.vocab_size,
        max_emails=data.train.max_emails,
        subject_len=data.train.subject_len,
    )


async def training_job(
    index: int,
    model: nn.Module,
    data: Data,
    args: argparse.Namespace,
    log_dir: Path,
    isolation: str = "thread",
) -> dict[str, Any]:
    """One job as a service runs it: built inside the event loop, then awaited. With
    ``--build async`` (the default) the job is an ``async with`` resource, built in a worker
    thread; ``--build factory`` calls the synchronous seed factory on the loop's thread."""
    start = time.perf_counter()
    train = DataLoader(data.train, batch_size=args.batch_size, shuffle=True)
    val = DataLoader(data.val, batch_size=256)
    config = TrainingConfig(
        run=RunConfig(
            experiment_name=f"responsiveness-{index}",
            max_epochs=args.epochs,
            log_dir=log_dir,
            seed=index,
            isolation=isolation,
        ),
        optim=OptimConfig(learning_rate=3e-3, max_grad_norm=1.0),
    )
    if args.build == "factory":
        job = create_optimized_training_optimizer(
            model=model, train_loader=train, val_loader=val, config=config
        )
    else:
        job = OptimizedTrainingOptimizer(config, model=model, train_loader=train, val_loader=val)
        await job.start()  # what `async with` does on enter: build in a worker thread
    built = time.perf_counter()
    try:
        results = await job.train()
    finally:
        await job.aclose()
    return {
        "build_s": round(built - start, 3),
        "train_s": round(time.perf_counter() - built, 3),
        "epochs": results.epochs_completed,
        "steps": results.global_step,
        "build_window": (start, built),
    }


def bare_torch_loop(
    model: nn.Module, data: Data, args: argparse.Namespace, max_steps: int | None = None
) -> dict[str, Any]:
    """The control: the same model, data and optimizer as the job, no ``core``, for
    ``--duration`` seconds (or ``max_steps`` steps)."""
    loader = DataLoader(data.train, batch_size=args.batch_size, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, fused=True)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    steps = 0
    end = time.perf_counter() + args.duration
    while time.perf_counter() < end and steps != max_steps:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
            if time.perf_counter() >= end or steps == max_steps:
                break
    return {"steps": steps}


async def gather(jobs: Sequence[Callable[[], Awaitable[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Run the jobs concurrently in this event loop; their results in order."""
    results: list[dict[str, Any]] = [{} for _ in jobs]

    async def one(i: int) -> None:
        results[i] = await jobs[i]()

    async with anyio.create_task_group() as tg:
        for i in range(len(jobs)):
            tg.start_soon(one, i)
    return results


async def prepare(kind: str, count: int, args: argparse.Namespace, log_dir: Path) -> Workload:
    """Build what must exist before the scenario starts (datasets, models) and return its
    workload: the measured window holds job start and training only."""
    if kind == "alone":

        async def alone() -> list[dict[str, Any]]:
            await anyio.sleep(args.duration)
            return []

        return alone
    data = build_data(args)
    models = [build_model(data, seed=i) for i in range(count)]
    if kind in ("train", "process"):
        isolation = "process" if kind == "process" else "thread"
        if args.warm_up:  # a warm service: imports and first-use costs paid before
            small = argparse.Namespace(**{**vars(args), "epochs": 1, "train_samples": 256})
            warm_data = build_data(small)
            warm = build_model(warm_data, 99)
            await training_job(99, warm, warm_data, small, log_dir / "w", isolation)
        jobs = [
            partial(training_job, i, m, data, args, log_dir, isolation)
            for i, m in enumerate(models)
        ]
        return partial(gather, jobs)

    # The control measures computing threads, not the optimizer's first-use imports: a few
    # steps in a worker thread before the window pay those.
    await anyio.to_thread.run_sync(bare_torch_loop, build_model(data, 99), data, args, 2)

    async def in_thread(model: nn.Module) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(bare_torch_loop, model, data, args)

    return partial(gather, [partial(in_thread, m) for m in models])


async def measure(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    kind, count = parse_spec(spec)
    with tempfile.TemporaryDirectory(prefix="responsiveness-") as tmp:
        run = await prepare(kind, count, args, Path(tmp))
        beat = Heartbeat(args.period_ms / 1000)
        slow = SlowCallbacks()
        sampler: StallSampler | None = None
        with contextlib.ExitStack() as stack:
            if args.trace_stalls:
                sampler = StallSampler(beat, threading.get_ident(), args.stall_threshold_ms / 1000)
                stack.enter_context(sampler)
                if args.asyncio_debug and args.runner == "asyncio":
                    import asyncio

                    loop = asyncio.get_running_loop()
                    loop.slow_callback_duration = args.stall_threshold_ms / 1000
                    logging.getLogger("asyncio").addHandler(slow)
                    stack.callback(logging.getLogger("asyncio").removeHandler, slow)
            other = stack.enter_context(OtherLoad())
            async with anyio.create_task_group() as tg:
                await tg.start(beat.run)
                start = time.perf_counter()
                details = await run()
                wall = time.perf_counter() - start
                tg.cancel_scope.cancel()
    builds = [job.pop("build_window") for job in details if "build_window" in job]
    result: dict[str, Any] = {
        "scenario": spec,
        "label": label(spec),
        "wall_s": round(wall, 3),
        "other_load_cores": None if other.cores is None else round(other.cores, 2),
        **latency_summary(beat.lateness_s, beat.missed),
        "jobs": details,
    }
    if builds:  # the same, leaving out the beats due while a job was being built
        after = [
            late
            for due, late in zip(beat.deadlines, beat.lateness_s, strict=True)
            if not any(lo <= due <= hi for lo, hi in builds)
        ]
        result["after_start"] = latency_summary(after, None)
    if sampler is not None:
        result["stalls"] = sampler.report()
        if args.asyncio_debug and args.runner == "asyncio":
            result["slow_callbacks"] = slow.report()
    return result


# -- the command ------------------------------------------------------------------------------
def parse_spec(spec: str) -> tuple[str, int]:
    match = _SPEC.match(spec)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{spec!r}: expected 'alone', 'train:K', 'process:K' or 'torch:K' (K concurrent "
            "jobs or threads)"
        )
    return match.group(1), int(match.group(2) or 1)


def label(spec: str) -> str:
    kind, count = parse_spec(spec)
    if kind == "alone":
        return "heartbeat alone"
    if kind in ("train", "process"):
        where = "process" if kind == "process" else "thread"
        return f"{count} training{'s' if count > 1 else ''} (core, {where})"
    return f"{count} bare torch loop{'s' if count > 1 else ''} in thread{'s' if count > 1 else ''}"


def run_isolated(
    spec: str, argv: Sequence[str], module: str = "benchmarks.responsiveness"
) -> dict[str, Any]:
    """Run one scenario of ``module`` in a fresh interpreter (the same options; ``--only``
    wins over ``--scenarios`` there) and return its result."""
    with tempfile.TemporaryDirectory(prefix="benchmark-result-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", module, *argv]
        command += ["--only", spec, "--result-file", str(out)]
        subprocess.run(command, cwd=ROOT, check=True)
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def goal(r: dict[str, Any]) -> str:
    met = r["p99_ms"] <= GOAL_P99_MS and r["worst_ms"] <= GOAL_WORST_MS
    return f"{'met' if met else 'NOT met'} (p99 {r['p99_ms']:.2f} ms, worst {r['worst_ms']:.1f} ms)"


def print_table(results: Sequence[dict[str, Any]]) -> None:
    header = (
        f"{'scenario':<34} {'wall s':>6} {'beats':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'worst ms':>9} {'>5ms':>5} {'>20ms':>6} {'other':>6}  jobs"
    )
    print(header)
    print("-" * len(header))

    def row(name: str, wall: str, r: dict[str, Any], other: str, jobs: str) -> None:
        print(
            f"{name:<34} {wall:>6} {r['beats']:>6} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
            f"{r['worst_ms']:>9.1f} {r['over_5ms']:>5} {r['over_20ms']:>6} {other:>6}  {jobs}"
        )

    for r in results:
        jobs = ", ".join(
            f"build {j['build_s']:.2f} s + train {j['train_s']:.1f} s ({j['epochs']} epochs)"
            if "build_s" in j
            else f"{j['steps']} steps"
            for j in r["jobs"]
        )
        other = r.get("other_load_cores")
        row(r["label"], f"{r['wall_s']:.2f}", r, "?" if other is None else f"{other:.2f}", jobs)
        if "after_start" in r:
            row("  beats due after the job builds", "", r["after_start"], "", "")
    print(
        "other: cores kept busy by other processes during the scenario; figures taken with "
        f"more than {DISTURBED_CORES:g} are disturbed"
    )
    disturbed = [
        r["label"] for r in results if (r.get("other_load_cores") or 0.0) > DISTURBED_CORES
    ]
    if disturbed:
        print(f"DISTURBED by other load, run again on a quiet machine: {', '.join(disturbed)}")


def trainings_of(count: int) -> tuple[tuple[str, int], ...]:
    return (("train", count), ("process", count))


def print_speed(results: Sequence[dict[str, Any]]) -> None:
    """Training throughput of process mode over thread mode, for each K measured in both
    (the same steps: the ratio of the scenarios' wall times, job start included)."""
    walls = {parse_spec(r["scenario"]): r["wall_s"] for r in results}
    for (kind, count), wall in sorted(walls.items()):
        if kind == "process" and ("train", count) in walls:
            print(
                f"\ntraining speed with {count} job{'s' if count > 1 else ''}, process / thread: "
                f"{walls[('train', count)] / wall:.3f} (wall {wall:.2f} s vs "
                f"{walls[('train', count)]:.2f} s, process start included)"
            )


def print_stalls(result: dict[str, Any], top: int) -> None:
    stalls = result.get("stalls")
    if stalls is None:
        return
    print(
        f"\n{result['label']}: {stalls['stalled_ms']:.0f} ms stalled beyond "
        f"{stalls['threshold_ms']:g} ms ({stalls['samples']} samples)"
    )
    print("  by function (innermost frame in core):")
    for row in stalls["by_function"][:top]:
        print(f"    {100 * row['share']:5.1f}%  {row['stalled_ms']:8.1f} ms  {row['where']}")
    print("  by line, with the innermost frame overall:")
    for row in stalls["by_line"][:top]:
        leaf = row["top_leaves"][0]["leaf"] if row["top_leaves"] else ""
        print(f"    {100 * row['share']:5.1f}%  {row['stalled_ms']:8.1f} ms  {row['where']}")
        if leaf and leaf != row["where"]:
            print(f"    {'':>21}  <- {leaf}")
    slow = result.get("slow_callbacks")
    if slow:
        print("  asyncio slow callbacks (debug mode):")
        for row in slow[:top]:
            print(f"    {row['count']:5d} x  {row['total_ms']:8.1f} ms  {row['callback']}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=None,
        help="any of alone, train:K, process:K, torch:K (default: alone train:1 train:N "
        "process:1 process:N torch:1 torch:N with N = --trainings)",
    )
    parser.add_argument(
        "--trainings", type=int, default=2, help="K of the default train:K, torch:K"
    )
    parser.add_argument("--duration", type=float, default=4.0, help="seconds of alone/torch")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-samples", type=int, default=2048)
    parser.add_argument("--val-samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--period-ms", type=float, default=5.0)
    parser.add_argument("--runner", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument(
        "--build",
        choices=["async", "factory"],
        default="async",
        help="build jobs as async resources (worker thread) or with the synchronous factory",
    )
    parser.add_argument(
        "--warm-up",
        action="store_true",
        help="run a short job first in each scenario's process (a warm service)",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="sys.setswitchinterval for the run (Python's default is 5 ms)",
    )
    parser.add_argument("--trace-stalls", action="store_true", help="report what blocked the loop")
    parser.add_argument("--stall-threshold-ms", type=float, default=5.0)
    parser.add_argument(
        "--asyncio-debug",
        action="store_true",
        help="with --trace-stalls: also asyncio debug mode's slow-callback reports",
    )
    parser.add_argument("--top", type=int, default=12, help="rows per stall table")
    parser.add_argument(
        "--retries",
        type=int,
        default=0,
        help="run a scenario again (up to N times) while other processes kept more than "
        f"{DISTURBED_CORES:g} cores busy during it; the least disturbed run is kept",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # one scenario, in this process
    parser.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scenarios is None:
        n = args.trainings
        args.scenarios = [
            "alone",
            "train:1",
            f"train:{n}",
            "process:1",
            f"process:{n}",
            "torch:1",
            f"torch:{n}",
        ]
        args.scenarios = list(dict.fromkeys(args.scenarios))
    for spec in args.scenarios:
        try:
            parse_spec(spec)
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
    return args


def main() -> None:
    args = parse_args()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    if args.only is not None:
        debug = args.trace_stalls and args.asyncio_debug and args.runner == "asyncio"
        options: dict[str, Any] = {"debug": True} if debug else {}
        result = anyio.run(measure, args.only, args, backend=args.runner, backend_options=options)
        if args.result_file is not None:
            args.result_file.write_text(json.dumps(result))
        else:
            print_table([result])
            print_stalls(result, args.top)
        return
    results = []
    for spec in args.scenarios:
        tries = []
        for attempt in range(1 + args.retries):
            print(f"running {spec}{f' (again, {attempt})' if attempt else ''} ...", flush=True)
            tries.append(run_isolated(spec, sys.argv[1:]))
            if (tries[-1].get("other_load_cores") or 0.0) <= DISTURBED_CORES:
                break
        results.append(min(tries, key=lambda r: r.get("other_load_cores") or 0.0))
    print(
        f"\nheartbeat every {args.period_ms:g} ms, runner {args.runner}, "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch "
        f"threads, switch interval {1000 * sys.getswitchinterval():g} ms"
        f"{', warm service' if args.warm_up else ', cold start (fresh process per scenario)'}"
        f"{', TRACED (timings perturbed)' if args.trace_stalls else ''}\n"
    )
    print_table(results)
    many = [r for r in results if parse_spec(r["scenario"]) in trainings_of(args.trainings)]
    for r in many:
        print(
            f"\ngoal with {r['label']}: p99 <= {GOAL_P99_MS:g} ms and worst <= "
            f"{GOAL_WORST_MS:g} ms: {goal(r)}"
        )
        if "after_start" in r:
            print(
                f"  leaving out the beats due while the jobs were built: {goal(r['after_start'])}"
            )
    print_speed(results)
    for r in results:
        print_stalls(r, args.top)
    if args.json:
        summary = {
            "period_ms": args.period_ms,
            "runner": args.runner,
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "switch_interval_ms": 1000 * sys.getswitchinterval(),
            "warm_up": args.warm_up,
            "traced": args.trace_stalls,
            "epochs": args.epochs,
            "train_samples": args.train_samples,
            "val_samples": args.val_samples,
            "batch_size": args.batch_size,
            "duration_s": args.duration,
            "scenarios": results,
        }
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
