"""What process isolation costs a service, by model size: thread and process mode side by side.

For each model size (``--sizes``: ``small`` about 0.3M parameters, ``60m`` about 58M, ``350m``
about 350M; an embedding, a stack of square linear layers and a head, trained with AdamW on
random token ids), one service process runs the same job in thread mode and in process mode,
alternated ``--repeats`` times, each with a fresh copy of the same model built before the
window. The service is warm: a small process-mode job ran first, so the fork server and
first-use imports are paid before any window (``async with`` on a service does the same).

Each window runs from the job's creation (on the event loop's thread, as a service creates
it) to ``train()``'s return, with a 5 ms heartbeat beside it, and reports:

- ``wall``: creation to return (process mode: the crossing into shared memory, the process
  start, training, and the hand-back into the service's model);
- ``first step``: ``train()`` called to the first ``train_step`` record seen;
- ``hand-back``: the ``run_end`` record seen to ``train()``'s return (process mode: the
  training process's exit and the copy of the trained weights into the service's model);
- the heartbeat's p99 and worst lateness over the whole window.

    python -m benchmarks.isolation                      # small, 60m, 350m; 3 repeats
    python -m benchmarks.isolation --sizes 60m --repeats 5 --steps 8

Goals (issue 31): process wall <= 1.15 x thread wall; heartbeat p99 <= 5 ms, worst <= 20 ms.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.responsiveness import Heartbeat, latency_summary
from core import (
    Callback,
    CheckpointConfig,
    LoggingConfig,
    OptimConfig,
    OptimizedTrainingOptimizer,
    RunConfig,
    TrainingConfig,
)
from core.callbacks import Record, RunInfo

SIZES = {"small": (1000, 128, 2), "60m": (32000, 1024, 24), "350m": (32000, 4096, 13)}
"""Vocabulary, width and depth of each model size."""
GOAL_RATIO, GOAL_P99_MS, GOAL_WORST_MS = 1.15, 5.0, 20.0


class Wide(nn.Module):
    """Token id -> embedding -> ``depth`` square linear layers -> 10 classes."""

    def __init__(self, vocab: int, width: int, depth: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.layers = nn.Sequential(
            *(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth))
        )
        self.head = nn.Linear(width, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.layers(self.embedding(tokens)))
        return out


def loader(vocab: int, steps: int, batch: int) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    n = steps * batch
    data = TensorDataset(
        torch.randint(vocab, (n,), generator=g), torch.randint(10, (n,), generator=g)
    )
    return DataLoader(data, batch_size=batch)


class Clock(Callback):
    """When the first train_step and the run_end records arrived."""

    def __init__(self) -> None:
        self.first_step: float | None = None
        self.run_end: float | None = None

    async def on_record(self, run: RunInfo, record: Record) -> None:
        if record["event"] == "train_step" and self.first_step is None:
            self.first_step = time.perf_counter()
        elif record["event"] == "run_end":
            self.run_end = time.perf_counter()


async def one_run(
    model: nn.Module, data: DataLoader[Any], isolation: str, log_dir: Path, period_s: float
) -> dict[str, Any]:
    beat, clock = Heartbeat(period_s), Clock()
    async with anyio.create_task_group() as tg:
        await tg.start(beat.run)
        created = time.perf_counter()
        # No checkpoint: what crosses is measured, not the disk. No reports: their writer,
        # a background process in both modes, would draw one run's figure in the next window.
        config = TrainingConfig(
            run=RunConfig(
                experiment_name=isolation,
                max_epochs=1,
                log_dir=log_dir,
                isolation=isolation,
                seed=0,
            ),
            optim=OptimConfig(learning_rate=1e-4),
            checkpoint=CheckpointConfig(checkpoint_every_n_epochs=None, save_on_cancel=False),
            logging=LoggingConfig(progress=False, reports=False),
        )
        job = OptimizedTrainingOptimizer(config, model=model, train_loader=data, callbacks=[clock])
        async with job:
            called = time.perf_counter()
            await job.train()
        returned = time.perf_counter()
        tg.cancel_scope.cancel()
    lateness = latency_summary(beat.lateness_s, beat.missed)
    return {
        "wall_s": returned - created,
        "first_step_s": (clock.first_step or returned) - called,
        "hand_back_s": returned - (clock.run_end or returned),
        "p99_ms": lateness["p99_ms"],
        "worst_ms": lateness["worst_ms"],
    }


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="isolation-") as tmp:
        vocab, width, depth = SIZES["small"]
        await one_run(Wide(vocab, width, depth), loader(vocab, 2, 4), "process", Path(tmp), 0.005)
        for size in args.sizes:
            vocab, width, depth = SIZES[size]
            torch.manual_seed(0)
            original = Wide(vocab, width, depth)
            params = sum(p.numel() for p in original.parameters())
            data = loader(vocab, args.steps, args.batch)
            runs: dict[str, list[dict[str, Any]]] = {"thread": [], "process": []}
            for _ in range(args.repeats):
                for isolation in ("thread", "process"):
                    model = copy.deepcopy(original)
                    runs[isolation].append(
                        await one_run(model, data, isolation, Path(tmp), args.period_ms / 1000)
                    )
                    del model
            rows.append({"size": size, "parameters": params, **runs})
    return rows


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"{datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, {args.steps} steps of batch "
        f"{args.batch}, AdamW, medians of {args.repeats} alternated runs, warm service\n"
    )
    header = (
        f"{'model':>14} {'mode':>8} {'wall s':>8} {'first step s':>13} {'hand-back s':>12} "
        f"{'p99 ms':>7} {'worst ms':>9}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        name = f"{row['size']} ({row['parameters'] / 1e6:.1f}M)"
        for mode in ("thread", "process"):
            runs = row[mode]
            worst = max(r["worst_ms"] for r in runs)
            print(
                f"{name:>14} {mode:>8} {median(runs, 'wall_s'):8.2f} "
                f"{median(runs, 'first_step_s'):13.3f} {median(runs, 'hand_back_s'):12.3f} "
                f"{median(runs, 'p99_ms'):7.2f} {worst:9.1f}"
            )
        ratios = [
            p["wall_s"] / t["wall_s"] for t, p in zip(row["thread"], row["process"], strict=True)
        ]
        ratio = statistics.median(ratios)
        verdict = "met" if ratio <= GOAL_RATIO else "NOT met"
        print(
            f"{'':>14} process/thread wall {ratio:.3f} (min {min(ratios):.3f}, max "
            f"{max(ratios):.3f}; goal <= {GOAL_RATIO}: {verdict})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--period-ms", type=float, default=5.0)
    args = parser.parse_args()
    rows = anyio.run(measure, args)
    report(rows, args)


if __name__ == "__main__":
    main()
