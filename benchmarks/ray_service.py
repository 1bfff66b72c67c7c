"""Runs placed on a Ray cluster (``isolation="ray"``) beside training processes: what a
service pays to start one, to hear its records, to cancel it, on its event loop, and to
cross a 60M-parameter model.

Each mode (``--modes``: ``ray``, ``process``, and ``thread``, the floor) runs in a fresh
interpreter: a service that has trained nothing yet. In ``ray`` mode that service first
starts a local Ray cluster of its own (``ray.init(num_cpus=2)``, its workers preloading
torch and core, as ``core`` does when it starts one), in a worker thread as ``core``'s own
connection does, timed apart (``import ray``, ``ray.init``). Then, one after the other, the
same small run (``benchmarks.cancel_storm``'s MLP and loader pacing 5 ms a batch,
``--steps`` steps, AdamW, no checkpoint but a cancel's, no reports; each on a fresh copy of
the model, built before the window), created on the event loop's thread and awaited there:

- the service's first run (``ray``: a new actor; ``process``: the fork server starts);
- ``--repeats`` warm runs (``ray``: the actor the first one left warm, the same request),
  then as many with ``logging.flush_interval_s=--fast-flush-s``;
- ``ray`` only: ``--repeats`` runs with ``ray.keep_warm=False``, a new actor each;
- ``--repeats`` runs of ``benchmarks.isolation``'s 60M model (``--big-steps`` steps of
  batch 8), and in ``ray`` one more on a new actor: the model crosses into the actor through
  Ray's object store and its trained weights come back, a cost that grows with the model;
- ``--repeats`` runs cancelled with ``task.cancel()`` once ``--cancel-after`` steps were
  delivered (a run too long to end first).

For each run: ``train()`` called to its first ``train_step`` record delivered by
``events()``; each ``train_step`` record's latency, from its ``ts`` (stamped in the step
thread, in the actor or the training process) to its delivery here (``time.time()``: one
machine, one clock); the ``run_end`` record delivered to ``train()``'s return (the
hand-back: the trained weights into the service's model); for a cancel, ``task.cancel()``
to ``run_end`` delivered (its status and its stop checkpoint checked) and to the task's
end. A 5 ms heartbeat runs beside it all, each window's beats kept apart. ``--trace-stalls``
adds ``benchmarks.responsiveness``'s sampler of what the loop's thread did while late.

    python benchmarks/ray_service.py                      # ray, process, thread
    python benchmarks/ray_service.py --modes ray --repeats 2 --steps 100 --json out.json

Goal (issue 44): the event loop keeps its heartbeat (p99 <= 5 ms, worst <= 20 ms) while a
run trains on the cluster, as in process mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import anyio
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script (python benchmarks/ray_service.py) too

from benchmarks.cancel_storm import Paced  # noqa: E402
from benchmarks.isolation import SIZES, Wide, loader  # noqa: E402
from benchmarks.machine_load import DISTURBED_CORES, OtherLoad  # noqa: E402
from benchmarks.responsiveness import (  # noqa: E402
    Heartbeat,
    StallSampler,
    latency_summary,
    print_stalls,
    run_isolated,
)
from core import (  # noqa: E402
    CheckpointConfig,
    LoggingConfig,
    OptimConfig,
    OptimizedTrainingOptimizer,
    RayConfig,
    RunConfig,
    TrainingConfig,
)
from core.callbacks import Record  # noqa: E402

Mode = Literal["ray", "process", "thread"]
MODES: tuple[Mode, ...] = ("ray", "process", "thread")
GOAL_P99_MS, GOAL_WORST_MS = 5.0, 20.0
PRELOAD = "torch,core"  # what core's connection preloads in the workers of a cluster it starts


# -- one run, as the service sees it --------------------------------------------------------
@dataclass
class Seen:
    """When a run's records arrived here (``perf_counter`` times) and how late each step's."""

    called: float
    first_step: float | None = None
    run_end: float | None = None
    end: Record | None = None
    latencies_s: list[float] = field(default_factory=list)
    steps: anyio.Event = field(default_factory=anyio.Event)
    """Set once ``wanted`` steps were delivered."""
    wanted: int = 0

    async def follow(self, stream: Any) -> None:
        try:
            async for record in stream:
                now, clock = time.time(), time.perf_counter()
                if record["event"] == "train_step":
                    self.latencies_s.append(now - stamped(record["ts"]))
                    if self.first_step is None:
                        self.first_step = clock
                    if len(self.latencies_s) >= self.wanted:
                        self.steps.set()
                elif record["event"] == "run_end":
                    self.run_end, self.end = clock, record
        finally:  # a run that ended before ``wanted`` steps is not waited for
            self.steps.set()


def stamped(ts: str) -> float:
    """A record's ``ts`` (ISO 8601 UTC, ``...Z``) as ``time.time()`` seconds."""
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def config_for(
    mode: Mode, log_dir: Path, *, keep_warm: bool = True, flush_interval_s: float = 0.25
) -> TrainingConfig:
    # No checkpoint but the stop checkpoint of a cancel: what crosses is measured, not the
    # disk. No reports: their writer, a background process, would draw in the next window.
    return TrainingConfig(
        run=RunConfig(
            experiment_name=f"ray-service-{mode}",
            max_epochs=1,
            log_dir=log_dir,
            isolation=mode,
            seed=0,
        ),
        optim=OptimConfig(learning_rate=1e-4),
        checkpoint=CheckpointConfig(checkpoint_every_n_epochs=None, save_on_cancel=True),
        logging=LoggingConfig(progress=False, reports=False, flush_interval_s=flush_interval_s),
        ray=RayConfig(num_cpus=1, keep_warm=keep_warm),
    )


async def one_run(
    model: nn.Module,
    data: Iterable[Any],
    mode: Mode,
    log_dir: Path,
    *,
    keep_warm: bool = True,
    flush_interval_s: float = 0.25,
    cancel_after: int | None = None,
) -> dict[str, Any]:
    """Create one run on this thread and await its ``train()`` (cancelled with
    ``task.cancel()`` once ``cancel_after`` steps arrived); what the service saw."""
    config = config_for(mode, log_dir, keep_warm=keep_warm, flush_interval_s=flush_interval_s)
    job = OptimizedTrainingOptimizer(config, model=model, train_loader=data)
    stream = job.events()
    seen = Seen(called=0.0, wanted=cancel_after or 0)
    cancelled: float | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(seen.follow, stream)
        seen.called = time.perf_counter()
        training = asyncio.ensure_future(job.train())
        if cancel_after is not None:
            await seen.steps.wait()
            cancelled = time.perf_counter()
            training.cancel()  # as a user's code cancels it: the asyncio task
            with contextlib.suppress(asyncio.CancelledError):
                await training
        else:
            await training
        returned = time.perf_counter()
    await job.aclose()
    end = seen.end or {}
    stop_checkpoint = end.get("last_checkpoint")
    result: dict[str, Any] = {}
    if cancelled is not None:
        result["cancel_to_run_end_s"] = None if seen.run_end is None else seen.run_end - cancelled
        result["cancel_to_return_s"] = returned - cancelled
    return {
        **result,
        "window": (seen.called, returned),
        "first_step_s": None if seen.first_step is None else seen.first_step - seen.called,
        "hand_back_s": None if seen.run_end is None else returned - seen.run_end,
        "wall_s": returned - seen.called,
        "steps": len(seen.latencies_s),
        "latencies_ms": [1000 * s for s in seen.latencies_s],
        "status": end.get("status"),
        "stop_checkpoint": bool(stop_checkpoint) and Path(str(stop_checkpoint)).exists(),
    }


# -- the scenario of one mode, in a fresh interpreter --------------------------------------
def start_ray(cpus: int) -> dict[str, float]:
    """Import Ray and start a local cluster of ``cpus`` CPUs, its workers preloading torch
    and core (a worker thread's call, as core's connection is)."""
    began = time.perf_counter()
    import ray

    imported = time.perf_counter()
    os.environ.setdefault("RAY_preload_python_modules", PRELOAD)
    # address="local": a cluster of this service's own; ray.init() with no address would
    # join the one another program on this machine recorded as the latest (a test session's)
    ray.init(address="local", num_cpus=cpus, namespace="core", configure_logging=False)
    return {"import_s": imported - began, "init_s": time.perf_counter() - imported}


def stop_ray() -> None:
    if "ray" in sys.modules:
        import ray

        ray.shutdown()


class Models:
    """The original of each model, built once (each run trains a fresh copy), and the
    loaders."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.manual_seed(0)
        self.small = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 2))
        self.small_data = Paced(args.steps)
        self.cancelled_data = Paced(100_000)  # never ends before its cancel
        vocab, width, depth = SIZES["60m"]
        self.big = Wide(vocab, width, depth)
        self.big_data = loader(vocab, args.big_steps, 8)


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


async def scenario(mode: Mode, args: argparse.Namespace) -> dict[str, Any]:
    models = Models(args)
    result: dict[str, Any] = {
        "mode": mode,
        "small_parameters": parameters(models.small),
        "big_parameters": parameters(models.big),
    }
    if mode == "ray":
        began = time.perf_counter()
        result["ray_start"] = await anyio.to_thread.run_sync(start_ray, args.ray_cpus)
        result["ray_start"]["window"] = (began, time.perf_counter())
    with tempfile.TemporaryDirectory(prefix="ray-service-") as tmp:
        count = 0

        async def run(model: nn.Module, data: Iterable[Any], **how: Any) -> dict[str, Any]:
            nonlocal count
            count += 1
            fresh = copy.deepcopy(model)  # built before the window, as a service has it
            return await one_run(fresh, data, mode, Path(tmp) / f"run-{count}", **how)

        small, big = models.small, models.big
        result["first"] = await run(small, models.small_data)
        result["warm"] = [await run(small, models.small_data) for _ in range(args.repeats)]
        result["fast_flush"] = [
            await run(small, models.small_data, flush_interval_s=args.fast_flush_s)
            for _ in range(args.repeats)
        ]
        if mode == "ray":
            result["new_actor"] = [
                await run(small, models.small_data, keep_warm=False) for _ in range(args.repeats)
            ]
        result["big_warm"] = [await run(big, models.big_data) for _ in range(args.repeats)]
        if mode == "ray":
            result["big_new_actor"] = await run(big, models.big_data, keep_warm=False)
        result["cancel"] = [
            await run(small, models.cancelled_data, cancel_after=args.cancel_after)
            for _ in range(args.repeats)
        ]
    return result


async def measure(mode: Mode, args: argparse.Namespace) -> dict[str, Any]:
    beat = Heartbeat(args.period_ms / 1000)
    sampler = StallSampler(beat, threading.get_ident(), args.stall_threshold_ms / 1000)
    try:
        with OtherLoad() as other, sampler if args.trace_stalls else contextlib.nullcontext():
            async with anyio.create_task_group() as tg:
                await tg.start(beat.run)
                result = await scenario(mode, args)
                tg.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(stop_ray)
    result["other_load_cores"] = None if other.cores is None else round(other.cores, 2)
    if args.trace_stalls:
        result["label"], result["stalls"] = mode, sampler.report()
    for window in windows(result):
        lo, hi = window.pop("window")
        window["lateness_ms"] = [
            1000 * late
            for due, late in zip(beat.deadlines, beat.lateness_s, strict=True)
            if lo <= due <= hi
        ]
    return result


def windows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every timed window of a scenario's result (each a dict with its ``window``)."""
    found: list[dict[str, Any]] = []
    for value in result.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and "window" in item:
                found.append(item)
    return found


# -- the table -----------------------------------------------------------------------------
def median(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def pooled(runs: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [value for r in runs for value in r[key]]


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def beats(runs: Sequence[dict[str, Any]]) -> str:
    summary = latency_summary([ms / 1000 for ms in pooled(runs, "lateness_ms")], None)
    met = summary["p99_ms"] <= GOAL_P99_MS and summary["worst_ms"] <= GOAL_WORST_MS
    return (
        f"{summary['p50_ms']:5.2f} {summary['p99_ms']:6.2f} {summary['worst_ms']:6.1f} "
        f"{'met' if met else 'NOT met':>7}"
    )


def print_table(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> None:
    first = results[0]
    print(
        f"\n{datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, heartbeat every "
        f"{args.period_ms:g} ms; small run: an MLP of {first['small_parameters']} parameters, "
        f"{args.steps} steps of a loader pacing 5 ms a batch; 60M: "
        f"{first['big_parameters'] / 1e6:.1f}M parameters, {args.big_steps} steps of batch 8; "
        f"medians of {args.repeats} runs (first run: one)\n"
    )
    for r in results:
        start = r.get("ray_start")
        if start is not None:
            print(
                f"ray, once per service: import ray {start['import_s']:.2f} s, "
                f"ray.init(num_cpus={args.ray_cpus}) {start['init_s']:.2f} s "
                f"(heartbeat p50/p99/worst ms, goal: {beats([start])})"
            )
    header = (
        f"{'mode':<8} {'runs':<28} {'first step s':>12} {'hand-back s':>11} {'wall s':>7}  "
        f"{'heartbeat p50  p99  worst   goal':>32}"
    )
    print(f"\n{header}\n{'-' * len(header)}")
    for r in results:
        rows = [("first run of the service", [r["first"]]), ("warm", r["warm"])]
        if "new_actor" in r:
            rows.append(("new actor (keep_warm=False)", r["new_actor"]))
        rows.append(("60M, warm", r["big_warm"]))
        if "big_new_actor" in r:
            rows.append(("60M, new actor", [r["big_new_actor"]]))
        for index, (name, runs) in enumerate(rows):
            print(
                f"{r['mode'] if index == 0 else '':<8} {name:<28} "
                f"{seconds(median(runs, 'first_step_s')):>12} "
                f"{seconds(median(runs, 'hand_back_s')):>11} "
                f"{seconds(median(runs, 'wall_s')):>7}  {beats(runs):>32}"
            )
    header = (
        f"{'mode':<8} {'records: flush_interval_s':<26} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'max ms':>7} {'records':>8}"
    )
    print(f"\n{header}\n{'-' * len(header)}")
    for r in results:
        for index, (flush, runs) in enumerate(
            ((0.25, r["warm"]), (args.fast_flush_s, r["fast_flush"]))
        ):
            ms = pooled(runs, "latencies_ms")
            summary = latency_summary([x / 1000 for x in ms], None)
            print(
                f"{r['mode'] if index == 0 else '':<8} {f'{flush:g} s (warm runs)':<26} "
                f"{summary['p50_ms']:>7.1f} {summary['p99_ms']:>7.1f} "
                f"{summary['worst_ms']:>7.1f} {len(ms):>8}"
            )
    header = (
        f"{'mode':<8} {'cancel to run_end s':>19} {'to return s':>11} {'status':>10} "
        f"{'stop checkpoint':>15}  {'whole run: heartbeat p50  p99  worst   goal':>43}"
    )
    print(f"\n{header}\n{'-' * len(header)}")
    for r in results:
        cancels = r["cancel"]
        statuses = ",".join(sorted({str(c["status"]) for c in cancels}))
        kept = sum(bool(c["stop_checkpoint"]) for c in cancels)
        print(
            f"{r['mode']:<8} {seconds(median(cancels, 'cancel_to_run_end_s')):>19} "
            f"{seconds(median(cancels, 'cancel_to_return_s')):>11} {statuses:>10} "
            f"{f'{kept}/{len(cancels)} kept':>15}  {beats(cancels):>43}"
        )
    print(
        f"\ngoal: heartbeat p99 <= {GOAL_P99_MS:g} ms and worst <= {GOAL_WORST_MS:g} ms; other "
        "load (cores kept busy by other processes): "
        + ", ".join(f"{r['mode']} {r.get('other_load_cores')}" for r in results)
        + f" (disturbed above {DISTURBED_CORES:g})"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind")
    parser.add_argument("--steps", type=int, default=300, help="steps of a small run")
    parser.add_argument("--big-steps", type=int, default=4, help="steps of a 60M run")
    parser.add_argument("--cancel-after", type=int, default=20, help="steps seen, then cancel")
    parser.add_argument(
        "--fast-flush-s", type=float, default=0.02, help="logging.flush_interval_s, second row"
    )
    parser.add_argument("--ray-cpus", type=int, default=2, help="the local cluster's CPUs")
    parser.add_argument("--period-ms", type=float, default=5.0)
    parser.add_argument("--trace-stalls", action="store_true", help="what blocked the loop")
    parser.add_argument("--stall-threshold-ms", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=12, help="rows per stall table")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--only", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.only is not None:
        result = anyio.run(measure, cast(Mode, args.only), args)
        if args.result_file is not None:
            args.result_file.write_text(json.dumps(result))
        else:
            print_table([result], args)
            print_stalls(result, args.top)
        return
    results = []
    for mode in args.modes:
        print(f"running {mode} ...", flush=True)
        results.append(run_isolated(mode, sys.argv[1:], "benchmarks.ray_service"))
    print_table(results, args)
    for result in results:
        print_stalls(result, args.top)
    if args.json:
        summary = {"args": vars(args), "results": results}
        args.json.write_text(json.dumps(summary, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
