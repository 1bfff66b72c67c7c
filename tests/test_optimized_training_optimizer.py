from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from core import (
    BatchFormatError,
    ConfigError,
    EmptyLoaderError,
    GradientAccumulationConfig,
    LossFormatError,
    TrainingConfig,
    TrainingResults,
    create_optimized_training_optimizer,
)
from tests.helpers import loaders, make_classification, make_model

pytestmark = pytest.mark.anyio

STEP_FIELDS = {
    "epoch",
    "step",
    "loss",
    "lr",
    "grad_norm",
    "loss_scale",
    "overflow",
    "skipped",
    "samples",
    "step_time_s",
    "data_time_s",
    "samples_per_s",
    "mem_allocated_bytes",
    "max_mem_allocated_bytes",
}


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def build(log_dir: Path, **kwargs: Any) -> Any:
    train_loader, val_loader = loaders(n=kwargs.pop("n", 256), shuffle=True)
    defaults: dict[str, Any] = {
        "model": make_model(),
        "train_loader": train_loader,
        "val_loader": val_loader,
        "experiment_name": "tiny",
        "max_epochs": 3,
        "learning_rate": 1e-2,
        "log_dir": log_dir,
        "seed": 0,
    }
    return create_optimized_training_optimizer(**(defaults | kwargs))


async def test_end_to_end_run_returns_results_and_writes_the_run_directory(log_dir: Path) -> None:
    optimizer = build(
        log_dir,
        early_stopping_patience=5,
        enable_amp=True,
        amp_dtype="auto",
        gradient_accumulation_config=GradientAccumulationConfig(accumulation_steps=3),
        max_grad_norm=1.0,
        learning_rate=0.05,
    )
    results = await optimizer.train()
    assert isinstance(results, TrainingResults)
    assert results.epochs_completed == 3
    assert results.global_step == 3 * math.ceil(8 / 3)  # 8 batches per epoch, windows of 3
    assert results.val_accuracy is not None and results.val_accuracy > 0.8
    assert results.best_val_loss == min(
        r["val_loss"] for r in read_events(results.run_dir) if r["event"] == "validation"
    )
    assert not results.stopped_early and results.samples_per_s > 0
    assert results.run_dir.parent == log_dir / "tiny"
    files = {p.name for p in results.run_dir.iterdir()} - {"training_metrics.png"}  # (conftest)
    assert files == {"events.jsonl", "config.json", "amp_stats.json", "performance_summary.txt"}
    written = json.loads((results.run_dir / "config.json").read_text())
    assert written["run"]["max_epochs"] == 3 and written["resolved"]["parameters"] > 0
    assert TrainingConfig.from_dict(written).to_dict() == optimizer.config.to_dict()
    assert json.loads((results.run_dir / "amp_stats.json").read_text())["total_steps"] == 9
    assert results.to_dict()["run_dir"] == str(results.run_dir)


async def test_event_log_parses_line_by_line_with_the_documented_fields(log_dir: Path) -> None:
    results = await build(log_dir, max_epochs=2).train()
    records = read_events(results.run_dir)
    kinds = [r["event"] for r in records]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert kinds.count("train_step") == results.global_step == 16
    assert kinds.count("validation") == kinds.count("epoch_end") == 2
    for record in records:
        assert {"event", "ts", "level", "run_id", "rank"} <= set(record)
        assert record["run_id"] == results.run_dir.name and record["rank"] == 0
    steps = [r for r in records if r["event"] == "train_step"]
    for record in steps:
        assert set(record) >= STEP_FIELDS
    assert [r["step"] for r in steps] == list(range(1, 17))
    assert records[0]["precision"] == "fp32" and records[0]["device"] == "cpu"
    assert records[-1]["status"] == "completed"


async def test_same_run_under_asyncio_and_trio_gives_the_same_weights(
    log_dir: Path, anyio_backend: str
) -> None:
    """Run under both backends (parametrised fixture); compare with a synchronous reference."""
    optimizer = build(log_dir, max_epochs=1)
    await optimizer.train()
    reference = build(log_dir, max_epochs=1)
    await anyio.to_thread.run_sync(lambda: anyio.run(reference.train, backend="asyncio"))
    for a, b in zip(optimizer.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(a, b)


async def test_event_loop_stays_responsive_during_training(log_dir: Path) -> None:
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.perf_counter()
        while True:
            await anyio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    optimizer = build(log_dir, n=16384, max_epochs=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat)
        started = time.perf_counter()
        await optimizer.train()
        elapsed = time.perf_counter() - started
        tg.cancel_scope.cancel()
    print(f"training_s={elapsed:.2f} heartbeats={len(gaps)} worst_gap_s={max(gaps):.4f}")
    assert elapsed > 0.2  # long enough for the measurement to mean something
    assert len(gaps) > 0.2 * elapsed / 0.005  # the 5 ms heartbeat kept (most of) its pace
    assert max(gaps) < 0.25


def step_thread_running() -> bool:
    return any(
        frame.f_code.co_filename.endswith("step_loop.py") or "step_loop.py" in repr(frame)
        for frame in _all_frames()
    )


def _all_frames() -> list[Any]:
    frames = []
    for top in sys._current_frames().values():
        frame = top
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
    return frames


async def test_cancellation_mid_epoch_stops_at_a_step_boundary_and_closes_everything(
    log_dir: Path,
) -> None:
    optimizer = build(log_dir, n=200_000, max_epochs=5)
    with anyio.move_on_after(0.5) as scope:
        await optimizer.train()
    assert scope.cancelled_caught
    assert not step_thread_running()
    steps_at_cancel = optimizer.global_step
    assert 0 < steps_at_cancel < 200_000 / 32  # inside the first epoch
    await anyio.sleep(0.1)
    assert optimizer.global_step == steps_at_cancel  # nothing runs on in the background
    records = read_events(optimizer.run_dir)
    assert records[-1]["event"] == "run_end" and records[-1]["status"] == "cancelled"
    assert sum(r["event"] == "train_step" for r in records) == steps_at_cancel
    log = optimizer._cycle.log
    assert log is not None and log.closed
    assert all(t.name != "step" for t in threading.enumerate())


async def test_events_stream_sees_every_record_of_the_log(log_dir: Path) -> None:
    optimizer = build(log_dir, max_epochs=2)
    seen: list[dict[str, Any]] = []
    stream = optimizer.events()  # subscribed before train() starts: sees run_start too

    async def consume() -> None:
        async with stream:
            async for record in stream:
                seen.append(record)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        results = await optimizer.train()
    assert [r["event"] for r in seen] == [r["event"] for r in read_events(results.run_dir)]
    assert seen[-1]["event"] == "run_end"


async def test_a_slow_consumer_loses_counted_events_and_never_blocks_training(
    log_dir: Path,
) -> None:
    optimizer = build(log_dir, max_epochs=2)
    stream = optimizer.events(capacity=4)
    received: list[str] = []
    results = await optimizer.train()  # nobody reads while training runs
    async for record in stream:
        received.append(record["event"])
    total = len(read_events(results.run_dir))
    assert len(received) == 4 and received[-1] == "run_end"
    assert stream.dropped == total - 4


class DictModel(nn.Module):
    """A model that computes its own loss from keyword arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(features)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class DictDataset(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        self.data = make_classification(n)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.data[i]
        return {"features": x, "labels": y}


async def test_dict_batches_use_the_models_own_loss(log_dir: Path) -> None:
    optimizer = create_optimized_training_optimizer(
        model=DictModel(),
        train_loader=DataLoader(DictDataset(256), batch_size=32),
        val_loader=DataLoader(DictDataset(64), batch_size=32),
        max_epochs=3,
        learning_rate=1e-2,
        log_dir=log_dir,
    )
    results = await optimizer.train()
    assert results.val_loss is not None and results.val_loss < 0.5
    # Accuracy from the outputs' logits and the batch's labels (the Hugging Face convention).
    assert results.val_accuracy is not None and results.val_accuracy > 0.8


async def test_without_val_loader_early_stopping_watches_the_train_loss(log_dir: Path) -> None:
    # A zero learning rate keeps the train loss flat, so patience 2 stops after 3 epochs.
    optimizer = build(
        log_dir,
        val_loader=None,
        max_epochs=10,
        early_stopping_patience=2,
        early_stopping_min_delta=1e-6,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.0),
    )
    results = await optimizer.train()
    assert results.stopped_early and results.epochs_completed == 3
    assert results.val_loss is None and results.best_val_loss is None
    assert results.train_loss is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        (
            {"learning_rate": -1.0},
            ConfigError,
            r"learning_rate=-1.0 is invalid; allowed: a finite float > 0",
        ),
        ({"max_epochs": 0}, ConfigError, r"max_epochs=0 is invalid"),
        (
            {"amp_dtype": "int8"},
            ConfigError,
            r"amp_dtype='int8' is invalid; allowed: 'auto', torch.float16",
        ),
        ({"amp_growth_factor": 0.5}, ConfigError, r"amp_growth_factor=0.5 is invalid"),
        ({"early_stopping_patience": 0}, ConfigError, r"early_stopping_patience=0 is invalid"),
        ({"max_grad_norm": -1.0}, ConfigError, r"max_grad_norm=-1.0 is invalid"),
        ({"experiment_name": "../x"}, ConfigError, r"experiment_name='../x' is invalid"),
        (
            {"model": "not a model"},
            ConfigError,
            r"model='not a model' is invalid; allowed: a torch.nn.Module",
        ),
        (
            {"optimizer": torch.optim.SGD(make_model().parameters(), lr=0.1)},  # another model's
            ConfigError,
            r"optimizer=<torch.optim.sgd.SGD object> is invalid; allowed: an optimizer over the "
            r"model's parameters, or a factory. Fix: 4 of its 4 parameters are not the model's",
        ),
        (
            {"train_loader": DataLoader(TensorDataset(torch.zeros(0, 8)), batch_size=4)},
            EmptyLoaderError,
            r"train_loader has no batches",
        ),
    ],
)
async def test_bad_arguments_fail_before_training_naming_the_field(
    kwargs: dict[str, Any], error: type[Exception], pattern: str, log_dir: Path
) -> None:
    with pytest.raises(error, match=pattern):
        build(log_dir, **kwargs)
    assert not log_dir.exists()  # nothing started


async def test_accumulation_config_error_through_the_factory(log_dir: Path) -> None:
    with pytest.raises(ConfigError, match="accumulation_steps=0"):
        build(
            log_dir, gradient_accumulation_config=GradientAccumulationConfig(accumulation_steps=0)
        )


async def test_a_batch_that_is_not_a_pair_or_dict_is_named(log_dir: Path) -> None:
    triples = DataLoader(
        TensorDataset(torch.randn(8, 8), torch.zeros(8).long(), torch.zeros(8)), batch_size=4
    )
    optimizer = build(log_dir, train_loader=triples, val_loader=None)
    with pytest.raises(BatchFormatError, match=r"batch 0 of epoch 0 is list of 3 \[Tensor"):
        await optimizer.train()
    assert optimizer.global_step == 0
    assert read_events(optimizer.run_dir)[-1]["status"] == "failed"


async def test_a_loss_that_is_not_a_scalar_is_named(log_dir: Path) -> None:
    optimizer = build(log_dir, loss_fn=nn.CrossEntropyLoss(reduction="none"), val_loader=None)
    with pytest.raises(
        LossFormatError,
        match=r"^loss_fn returned Tensor\(shape=\(32,\).* in epoch 0, step 1, batch 0; "
        r".*reduction='mean'",
    ):
        await optimizer.train()
    assert optimizer.global_step == 0
    # With a val_loader, the sanity check meets it first, and says it was validating.
    optimizer = build(log_dir, loss_fn=nn.CrossEntropyLoss(reduction="none"))
    with pytest.raises(LossFormatError, match=r"^loss_fn returned .* validation batch 0;"):
        await optimizer.train()
