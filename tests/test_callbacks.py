"""Callbacks observe a run from the event loop: in order, isolated, never slowing it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from core import (
    Callback,
    CheckpointConfig,
    ConfigError,
    OptimizedTrainingOptimizer,
    RunConfig,
    TrainingConfig,
)
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


class SlowLoader:
    """A loader taking ``delay_s`` per batch: a run long enough for a callback to act."""

    def __init__(self, loader: Any, delay_s: float) -> None:
        self.loader, self.delay_s = loader, delay_s

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        for batch in self.loader:
            time.sleep(self.delay_s)
            yield batch


def job(
    log_dir: Path,
    callbacks: list[Callback],
    loader_delay_s: float = 0.0,
    progress: bool = True,
    **run: Any,
) -> OptimizedTrainingOptimizer:
    train, val = loaders(n=128)
    if loader_delay_s:
        train = SlowLoader(train, loader_delay_s)
    config = TrainingConfig(
        run=RunConfig(log_dir=log_dir, **({"max_epochs": 2} | run)),
        logging=LoggingConfig(event_buffer_size=4096, flush_interval_s=0.05, progress=progress),
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
        "run_start:0:True",
        "epoch_end:0",
        "checkpoint",
        "epoch_end:1",
        "checkpoint",
        "run_end:completed:True",
    ]
    assert seen.threads == {loop_thread}  # never the step thread


class Failing(Callback):
    def __init__(self) -> None:
        self.calls = 0

    async def on_record(self, run: RunInfo, record: Record) -> None:
        self.calls += 1
        if record["event"] == "train_step":
            raise ValueError("tracker is down")


async def test_a_failing_callback_is_reported_once_and_never_stops_training(
    log_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failing, seen = Failing(), Recorder()
    results = await job(log_dir, [failing, seen], progress=False).train()
    written = read(results.run_dir)
    failures = [r for r in written if r.get("kind") == "callback_failed"]
    assert len(failures) == 1 and failures[0]["callback"] == "Failing"
    assert "ValueError: tracker is down" in failures[0]["error"]
    # Where it broke is kept (the record) and shown (stderr, although progress=False).
    where = 'raise ValueError("tracker is down")'
    assert where in failures[0]["traceback"] and "test_callbacks.py" in failures[0]["traceback"]
    err = capsys.readouterr().err
    assert "callback_failed" in err and "callback=Failing" in err and where in err
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


# -- callbacks that steer ----------------------------------------------------------------
class StopOnBudget(Callback):
    """Stops the run once ``samples`` training samples were seen (a service's budget)."""

    def __init__(self, samples: int) -> None:
        self.budget, self.seen, self.answers = samples, 0, []
        self.at_run_end: bool | None = None

    async def on_train_step(self, run: RunInfo, record: Record) -> None:
        self.seen += record["samples"]
        if self.seen >= self.budget:
            self.answers.append(run.request_stop(f"the budget of {self.budget} samples is spent"))

    async def on_run_end(self, run: RunInfo, record: Record) -> None:
        self.at_run_end = run.request_stop("too late")  # run_end is written: no run to stop


class StopOnBudgetEachStep(StopOnBudget):
    steers_each_step = True


async def test_a_callback_stops_the_run_with_its_reason_and_a_checkpoint(log_dir: Path) -> None:
    budget = StopOnBudgetEachStep(samples=96)  # 3 steps of 32; the run has 12
    run = job(log_dir, [budget], max_epochs=3, loader_delay_s=0.05)
    results = await run.train()
    assert budget.answers == [True] and budget.at_run_end is False
    # Steering each step, the run stops at the step whose record asked (as Lightning);
    # otherwise that record is read back during the next step, and the stop lands later.
    assert results.global_step == 3
    assert results.stop_reason == "requested: the budget of 96 samples is spent"
    assert not results.stopped_early and not results.interrupted
    records = read(results.run_dir)
    end = records[-1]
    assert (end["event"], end["status"], end["stop_reason"]) == (
        "run_end",
        "stopped",
        results.stop_reason,
    )
    saved = [r for r in records if r["event"] == "checkpoint" and r["reason"] == "requested"]
    assert [r["step"] for r in saved] == [results.global_step]
    assert run.checkpoints.latest.path == Path(saved[0]["path"])
    assert run.request_stop("late") is False  # no run in progress
    # The stopped run is unfinished: resumed, it trains to its end, and no longer says why
    # the earlier one stopped.
    train, val = loaders(n=128)
    config = TrainingConfig(
        run=RunConfig(log_dir=log_dir, max_epochs=3), checkpoint=CheckpointConfig(resume="auto")
    )
    resumed = OptimizedTrainingOptimizer(
        config, model=make_model(), train_loader=SlowLoader(train, 0.0), val_loader=val
    )
    again = await resumed.train()
    assert (again.global_step, again.stop_reason) == (12, None)
    events = read(again.run_dir)
    assert [r["step"] for r in events if r["event"] == "resumed"] == [results.global_step]
    assert events[-1]["status"] == "completed"


async def test_per_step_and_validation_hooks_see_their_records(log_dir: Path) -> None:
    class Hooks(Callback):
        def __init__(self) -> None:
            self.steps: list[int] = []
            self.validations: list[float] = []

        async def on_train_step(self, run: RunInfo, record: Record) -> None:
            self.steps.append(record["step"])

        async def on_validation_end(self, run: RunInfo, record: Record) -> None:
            self.validations.append(record["val_loss"])

    hooks = Hooks()
    await job(log_dir, [hooks], max_epochs=2).train()
    assert hooks.steps == list(range(1, 9)) and len(hooks.validations) == 2


@pytest.mark.slow
def test_a_callback_stops_a_run_in_a_training_process(tmp_path: Path) -> None:
    from tests import isolation_parts as parts

    budget = StopOnBudget(samples=24)  # 3 steps of 8; the run has 24
    run = OptimizedTrainingOptimizer(
        TrainingConfig(run=RunConfig(log_dir=tmp_path, max_epochs=2, isolation="process")),
        model=parts.make_model(),
        train_loader=parts.SlowLoader(0.05),
        callbacks=[budget],
    )
    results = asyncio.run(run.train())
    assert budget.answers[0] is True and budget.at_run_end is False
    assert 3 < results.global_step < 24
    assert results.stop_reason == "requested: the budget of 24 samples is spent"
    end = read(results.run_dir)[-1]
    assert (end["status"], end["stop_reason"]) == ("stopped", results.stop_reason)
