"""What the step thread waits for: its wall time per step against its own CPU time per step,
with each of the threads beside it on and off.

A step thread that computes for 1 ms and takes 1.2 ms of wall time waited 0.2 ms: for the
interpreter lock, which the run-log drain, the monitor's sampling thread and the event
loop (progress lines, ``events()`` consumers, callbacks) also take, or for a core the
machine gave to someone else. A hand-written loop has none of those threads. Each job trains
the tiny MLP of ``benchmarks.step_cost`` (one torch thread) for ``--steps`` steps; jobs are
alternated in rounds and the figures are medians of (wall - CPU) per step, in microseconds,
with the hand-written loop (run in a thread, as core runs its steps) beside them.

On a GPU (``--device cuda``, the default where there is one) the step thread also waits for
the device (core's lagged readback waits for step N-1 once per step; the hand loop never
does): compare the settings with each other there, not with the hand loop's wait.

    python -m benchmarks.step_wait
    python -m benchmarks.step_wait --rounds 9 --steps 400
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.models import mlp
from core import MultiGPUConfig, create_optimized_training_optimizer
from core.loop.epoch import StepLoop

Batch = tuple[torch.Tensor, torch.Tensor]
Span = tuple[float, float, int]  # wall seconds, step-thread CPU seconds, steps


@contextmanager
def _timing_steps(spans: list[Span]) -> Iterator[None]:
    original = StepLoop.run_epoch

    @functools.wraps(original)
    def run_epoch(self: StepLoop, *args: Any, **kwargs: Any) -> Any:
        wall, cpu, before = time.perf_counter(), time.thread_time(), self.global_step
        try:
            return original(self, *args, **kwargs)
        finally:
            spans.append(
                (time.perf_counter() - wall, time.thread_time() - cpu, self.global_step - before)
            )

    StepLoop.run_epoch = run_epoch  # type: ignore[method-assign]
    try:
        yield
    finally:
        StepLoop.run_epoch = original  # type: ignore[method-assign]


def _setting(
    *,
    monitor: bool = False,
    monitor_s: float = 1.0,
    drain_s: float = 60.0,
    progress: bool = False,
    consumer: bool = False,
) -> dict[str, Any]:
    """A job's threads: by default none runs during the steps (the log is drained at
    the epoch's end)."""
    return {
        "monitor": monitor,
        "monitor_s": monitor_s,
        "drain_s": drain_s,
        "progress": progress,
        "consumer": consumer,
    }


SETTINGS: dict[str, dict[str, Any]] = {
    "alone": _setting(),
    "+ log drain every 0.25 s": _setting(drain_s=0.25),
    "+ monitor every 1 s": _setting(monitor=True),
    "+ monitor every 0.1 s": _setting(monitor=True, monitor_s=0.1),
    "+ progress lines": _setting(progress=True),
    "+ an events() consumer": _setting(drain_s=0.25, consumer=True),
    "defaults (drain, monitor)": _setting(monitor=True, drain_s=0.25),
}


def core_job(
    model: nn.Module, batches: list[Batch], log_dir: Path, setting: dict[str, Any]
) -> Span:
    spans: list[Span] = []
    with _timing_steps(spans):
        run = create_optimized_training_optimizer(
            model=model,
            train_loader=batches,
            max_epochs=1,
            learning_rate=1e-4,
            max_grad_norm=1.0,
            log_dir=log_dir,
            checkpoint_every_n_epochs=None,
            reports=False,
            progress=setting["progress"],
            log_flush_interval_s=setting["drain_s"],
            multi_gpu_config=MultiGPUConfig(enable_gpu_monitoring=setting["monitor"]),
            monitor_interval_s=setting["monitor_s"],
        )

        async def main() -> None:
            if not setting["consumer"]:
                await run.train()
                return

            async def consume() -> None:
                async for _ in run.events():
                    pass

            consumer = asyncio.create_task(consume())
            await run.train()
            await consumer

        asyncio.run(main())
        run.close()
    return spans[0]


def hand_job(model: nn.Module, batches: list[Batch]) -> Span:
    device = next(model.parameters()).device
    out: list[Span] = []

    def body() -> None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        loss_fn = nn.CrossEntropyLoss()
        wall, cpu = time.perf_counter(), time.thread_time()
        for x, y in batches:
            loss_fn(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()  # the timing boundary: the queued steps done
        out.append((time.perf_counter() - wall, time.thread_time() - cpu, len(batches)))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return out[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = mlp(features=32, hidden=64, classes=10).to(device)
    g = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randn(32, 32, generator=g).to(device),
            torch.randint(10, (32,), generator=g).to(device),
        )
        for _ in range(args.steps)
    ]
    names = ["hand", *SETTINGS]
    with tempfile.TemporaryDirectory() as tmp:

        def run(name: str) -> Span:
            replica = copy.deepcopy(model)
            if name == "hand":
                return hand_job(replica, batches)
            return core_job(replica, batches, Path(tmp), SETTINGS[name])

        for name in names:  # warm-up
            run(name)
        results: dict[str, list[Span]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                results[name].append(run(name))

    def per_step(spans: list[Span], figure: Callable[[Span], float]) -> float:
        return statistics.median(1e6 * figure(s) / s[2] for s in spans)

    print(
        f"torch {torch.__version__}, {device}; MLP 32-64-64-10, batch 32, fp32, 1 torch thread; "
        f"{args.steps} steps x {args.rounds} rounds; microseconds per step, medians"
    )
    print(f"{'job':<28} {'wall':>8} {'CPU':>8} {'waited':>8}")
    for name in names:
        wall = per_step(results[name], lambda s: s[0])
        cpu = per_step(results[name], lambda s: s[1])
        waited = per_step(results[name], lambda s: s[0] - s[1])
        print(f"{name:<28} {wall:>8.1f} {cpu:>8.1f} {waited:>8.1f}")


if __name__ == "__main__":
    main()
