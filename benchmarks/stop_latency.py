"""Where a callback's stop lands: the step of the record that asked, against the step the
run stopped at, in thread mode (with and without ``steers_each_step``), under
``isolation="process"`` and under ``devices=2``.

A callback calls ``run.request_stop`` from ``on_train_step`` at the record of step ``--at``;
each batch takes ``--batch-ms`` in the loader, so a stop that waits for time (the log's
drain, a relay) shows as steps. Prints, per mode, the steps the stop landed after the
record that asked for it (0: at that step, as Lightning stops).

    python -m benchmarks.stop_latency
    python -m benchmarks.stop_latency --at 100 --batch-ms 5 --repeats 3 --modes thread steer
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from core import Callback, create_optimized_training_optimizer
from core.callbacks import Record, RunInfo

MODES = {
    "thread": {},
    "steer": {},
    "process": {"isolation": "process"},
    "devices2": {"devices": 2},
}


class Paced:
    """Batches of a small classification set, each after ``delay_s`` (importable: a
    training process rebuilds it)."""

    def __init__(self, batches: int, delay_s: float) -> None:
        x = torch.randn(batches * 8, 16, generator=torch.Generator().manual_seed(0))
        self.loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            time.sleep(self.delay_s)
            yield batch


class StopAt(Callback):
    """Asks for a stop at the record of step ``at``."""

    def __init__(self, at: int) -> None:
        self.at, self.asked = at, False

    async def on_train_step(self, run: RunInfo, record: Record) -> None:
        if record["step"] >= self.at and not self.asked:
            self.asked = run.request_stop(f"step {record['step']} reached")


class SteeringStopAt(StopAt):
    steers_each_step = True


def stopped_at(mode: str, at: int, delay_s: float, log_dir: Path) -> int:
    callback = SteeringStopAt(at) if mode == "steer" else StopAt(at)
    job = create_optimized_training_optimizer(
        model=nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)),
        train_loader=Paced(at * 4, delay_s),
        max_epochs=1,
        callbacks=[callback],
        log_dir=log_dir,
        experiment_name=f"stop-{mode}",
        progress=False,
        reports=False,
        **MODES[mode],
    )
    results = asyncio.run(job.train())
    return int(results.global_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=int, default=100)
    parser.add_argument("--batch-ms", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as log_dir:
        for mode in args.modes:
            late = [
                stopped_at(mode, args.at, args.batch_ms / 1000, Path(log_dir)) - args.at
                for _ in range(args.repeats)
            ]
            print(f"{mode:9s} stop at step {args.at}: landed {late} steps later")


if __name__ == "__main__":
    main()
