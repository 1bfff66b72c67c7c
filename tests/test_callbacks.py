"""Callbacks observe a run from the event loop: in order, isolated, never slowing it."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from core import Callback, ConfigError, OptimizedTrainingOptimizer, RunConfig, TrainingConfig
from core.callbacks import Record, RunInfo
from core.telemetry.config import LoggingConfig
from tests.helpers import loaders, make_model

pytestmark = pytest.mark.anyio


class Recorder(Callback):
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.hooks: list[str] = []
        self.threads: set[int] = set()

    async def on_run_start(self, run: RunInfo, record: Record) -> None:
        self.hooks.append(f"run_start:{run.rank}:{run.is_global_zero}")

    async def on_record(self, run: RunInfo, record: Record) -> None:
        self.records.append(record)
        self.threads.add(threading.get_ident())

    async def on_epoch_end(self, run: RunInfo, record: Record) -> None:
        self.hooks.append(f"epoch_end:{record['epoch']}")

    async def on_checkpoint(self, run: RunInfo, record: Record) -> None:
        self.hooks.append("checkpoint")

    async def on_run_end(self, run: RunInfo, record: Record) -> None:
        self.hooks.append(f"run_end:{record['status']}:{run.run_dir is not None}")


def job(log_dir: Path, callbacks: list[Callback], **run: Any) -> OptimizedTrainingOptimizer:
    train, val = loaders(n=128)
    config = TrainingConfig(
        run=RunConfig(log_dir=log_dir, **({"max_epochs": 2} | run)),
        logging=LoggingConfig(event_buffer_size=4096, flush_interval_s=0.05),
    )
    return OptimizedTrainingOptimizer(
        config, model=make_model(), train_loader=train, val_loader=val, callbacks=callbacks
    )


def read(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


async def test_a_callback_sees_every_record_in_order_on_the_event_loop(log_dir: Path) -> None:
    seen = Recorder()
    async with job(log_dir, [seen]) as run:
        loop_thread = threading.get_ident()
        results = await run.train()
    written = read(results.run_dir)
    assert [r["event"] for r in seen.records] == [r["event"] for r in written]
    assert [r.get("step") for r in seen.records] == [r.get("step") for r in written]
    assert seen.hooks == [
        "run_start:0:True", "epoch_end:0", "checkpoint", "epoch_end:1", "checkpoint",
        "run_end:completed:True",
    ]  # fmt: skip
    assert seen.threads == {loop_thread}  # never the step thread


class Failing(Callback):
    def __init__(self) -> None:
        self.calls = 0

    async def on_record(self, run: RunInfo, record: Record) -> None:
        self.calls += 1
        if record["event"] == "train_step":
            raise ValueError("tracker is down")


async def test_a_failing_callback_is_reported_once_and_never_stops_training(log_dir: Path) -> None:
    failing, seen = Failing(), Recorder()
    results = await job(log_dir, [failing, seen]).train()
    written = read(results.run_dir)
    failures = [r for r in written if r.get("kind") == "callback_failed"]
    assert len(failures) == 1 and failures[0]["callback"] == "Failing"
    assert "ValueError: tracker is down" in failures[0]["error"]
    first_step = [r["event"] for r in written].index("train_step")
    assert failing.calls == first_step + 1  # up to the first train_step, then never again
    assert written[-1]["status"] == "completed" and results.global_step == 8
    assert seen.hooks[-1] == "run_end:completed:True"  # the others are unaffected


class Slow(Callback):
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def on_record(self, run: RunInfo, record: Record) -> None:
        self.seen.append(record["event"])
        await anyio.sleep(0.05)


async def test_a_slow_callback_loses_its_oldest_records_and_training_does_not_wait(
    log_dir: Path,
) -> None:
    slow = Slow()
    train, _ = loaders(n=1024, batch_size=8)
    config = TrainingConfig(
        run=RunConfig(log_dir=log_dir, max_epochs=1),
        logging=LoggingConfig(event_buffer_size=8, flush_interval_s=0.05, progress=False),
    )
    results = await OptimizedTrainingOptimizer(
        config, model=make_model(), train_loader=train, callbacks=[slow]
    ).train()
    written = read(results.run_dir)
    assert results.global_step == 128
    # Had training waited for the callback, it would have seen every record.
    assert len(slow.seen) < len(written) and slow.seen[-1] == "run_end"
    assert next(r for r in written if r["event"] == "callback_lagging")["callback"] == "Slow"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cancelled_run_still_delivers_run_end(log_dir: Path) -> None:
    seen = Recorder()
    train, _ = loaders(n=4096, batch_size=8)
    config = TrainingConfig(run=RunConfig(log_dir=log_dir, max_epochs=50))
    run = OptimizedTrainingOptimizer(
        config, model=make_model(), train_loader=train, callbacks=[seen]
    )
    task = asyncio.ensure_future(run.train())
    while not any(r["event"] == "train_step" for r in seen.records):
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen.hooks[-1] == "run_end:cancelled:True"


def test_callbacks_must_be_callback_instances(log_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"^callbacks=.*print.* is invalid; allowed: instances"):
        job(log_dir, [print])  # type: ignore[list-item]


class FailsOnTheLastEpoch(Callback):
    async def on_epoch_end(self, run: RunInfo, record: Record) -> None:
        if record["epoch"] == 1:
            raise ValueError("a bug seen only at the end")


async def test_a_callback_failing_on_the_last_records_is_reported_before_run_end(
    log_dir: Path,
) -> None:
    # Records reach callbacks only at epoch edges and at the end (a long flush interval):
    # the failing hook runs while the run is closing, and must still be in the run's log.
    train, _ = loaders(n=64)
    config = TrainingConfig(
        run=RunConfig(log_dir=log_dir, max_epochs=2),
        logging=LoggingConfig(flush_interval_s=60.0),
    )
    results = await OptimizedTrainingOptimizer(
        config, model=make_model(), train_loader=train, callbacks=[FailsOnTheLastEpoch()]
    ).train()
    written = read(results.run_dir)
    assert written[-1]["event"] == "run_end" and written[-1]["status"] == "completed"
    (failure,) = [r for r in written if r.get("kind") == "callback_failed"]
    assert "a bug seen only at the end" in failure["error"]
