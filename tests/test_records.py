"""The written log schema: every record real runs write fits ``core.telemetry.records``, the
check can fail, and docs/log-schema.md shows the schema exactly as generated."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from core import create_optimized_training_optimizer
from core.callbacks import Callback, Record, RunInfo
from core.errors import TrainingStepError
from core.monitoring.gpu_monitor import GPUMonitor
from core.telemetry.records import RECORDS
from core.telemetry.schema_doc import check_record, fields_of, schema_markdown
from tests.helpers import loaders, make_classification, make_model
from tests.test_gpu_monitor import FakeNvml

SCHEMA_PAGE = Path(__file__).resolve().parents[1] / "docs" / "log-schema.md"
START, END = "<!-- log-schema:start -->\n", "<!-- log-schema:end -->"


class Pausing:
    """A loader that waits once before its ``at``-th batch: ``pause_s``, or until released."""

    def __init__(self, loader: DataLoader[Any], at: int, pause_s: float) -> None:
        self.loader, self.at, self.pause_s = loader, at, pause_s
        self.batch_size = loader.batch_size
        self.waiting, self.release = threading.Event(), threading.Event()

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for index, batch in enumerate(self.loader):
            if index == self.at and self.pause_s:
                self.waiting.set()
                self.release.wait(self.pause_s)
                self.pause_s = 0.0
            yield batch


class Slow(Callback):
    """A callback that falls behind (and is told so)."""

    async def on_record(self, run: RunInfo, record: Record) -> None:
        await anyio.sleep(0.01)


class Broken(Callback):
    """A callback whose epoch hook raises (reported once, then no longer called)."""

    async def on_epoch_end(self, run: RunInfo, record: Record) -> None:
        raise ValueError("a bug in a callback")


class Flaky(nn.Module):
    """Out of memory above 8 samples, a NaN loss at the 3rd training forward and in every
    evaluation, and a failing forward at the 30th (in the second epoch)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            if x.shape[0] > 8:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 MiB")
            self.calls += 1
            if self.calls == 30:
                raise RuntimeError("a corrupt sample")
        out: torch.Tensor = self.net(x)
        return out * float("nan") if not self.training or self.calls == 3 else out


class OverflowInFP16(nn.Module):
    """Infinite gradients whenever it runs under fp16 autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        if self.training and out.dtype == torch.float16:
            out.register_hook(lambda g: torch.full_like(g, float("inf")))
        return out


def train(log_dir: Path, experiment: str, **kwargs: Any) -> Any:
    kwargs.setdefault("model", make_model())
    optimizer = create_optimized_training_optimizer(
        experiment_name=experiment, log_dir=log_dir, monitor_interval_s=0.02, seed=0, **kwargs
    )
    anyio.run(optimizer.train)
    return optimizer


def run_jobs(log_dir: Path) -> None:
    """Small CPU jobs that between them write nearly every kind of record."""
    train_loader, val_loader = loaders(n=256, batch_size=32)
    job = dict(val_loader=val_loader, max_epochs=2, checkpoint_every_n_steps=4, keep_last_n=2)
    # Checkpoints, validation, a data stall, psutil samples, a slow and a failing callback.
    # Best checkpoints and a profiled window too.
    train(
        log_dir,
        "plain",
        train_loader=Pausing(train_loader, 2, 0.3),
        data_stall_warn_s=0.1,
        callbacks=[Slow(), Broken()],
        event_buffer_size=8,
        save_best=True,
        profile_steps=(1, 1, 2),
        **job,
    )
    # Resume past a damaged newest checkpoint (an error record, then resumed).
    newest = max((log_dir / "plain" / "checkpoints").glob("step-*"))
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    train(log_dir, "plain", train_loader=Pausing(train_loader, 2, 0.0), resume="auto", **job)
    # Its lineage has finished: resume="auto" leaves it alone and says so (fresh_start).
    train(log_dir, "plain", train_loader=train_loader, resume="auto", **job)
    # fp16 overflows down to min_scale, then the fallback; NVML samples, one counter missing.
    fake = FakeNvml(devices=1, unsupported=("nvmlDeviceGetTemperature",))
    init = GPUMonitor.__init__

    def on_fake_nvml(self: GPUMonitor, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **(kwargs | {"device_indices": [0], "nvml": fake}))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GPUMonitor, "__init__", on_fake_nvml)
        train(
            log_dir,
            "fp16",
            model=OverflowInFP16(),
            amp_dtype=torch.float16,
            amp_init_scale=16.0,
            train_loader=DataLoader(make_classification(256), 16),
            max_epochs=1,
            checkpoint_every_n_epochs=None,
        )
    # A compiled model (CPU inductor): the compile record at the first step.
    train(
        log_dir,
        "compiled",
        compile=True,
        train_loader=DataLoader(make_classification(64), 32),
        max_epochs=1,
        checkpoint_every_n_epochs=None,
    )
    # Out of memory, a NaN step, a NaN validation loss, then a failing step.
    with pytest.raises(TrainingStepError, match="a corrupt sample"):
        train(
            log_dir,
            "faults",
            model=Flaky(),
            amp_dtype=torch.float32,
            val_loader=val_loader,
            train_loader=DataLoader(make_classification(160), 32),
            max_epochs=2,
        )
    # A loader that hangs through a stop: the step thread is parked at the step boundary.
    hanging = Pausing(DataLoader(make_classification(64), 8), 3, 30.0)
    stop_while(
        log_dir, hanging.waiting, model=make_model(), train_loader=hanging, experiment_name="hung"
    )
    hanging.release.set()
    # A step that hangs through a stop: the step thread is abandoned.
    stuck = Stuck()
    stop_while(
        log_dir,
        stuck.waiting,
        model=stuck,
        experiment_name="stuck",
        train_loader=DataLoader(make_classification(64), 8),
    )
    stuck.release.set()


class Stuck(nn.Module):
    """A model whose third training forward waits until released (or 30 s)."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.calls = make_model(), 0
        self.waiting, self.release = threading.Event(), threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.training and self.calls == 3:
            self.waiting.set()
            self.release.wait(30.0)
        out: torch.Tensor = self.net(x)
        return out


def stop_while(log_dir: Path, waiting: threading.Event, **kwargs: Any) -> None:
    """Cancel a run once ``waiting`` is set (a stop grace of 0.3 s)."""
    optimizer = create_optimized_training_optimizer(
        max_epochs=1,
        log_dir=log_dir,
        checkpoint_every_n_steps=2,
        stop_grace_s=0.3,
        loader_grace_s=0.1,
        monitor_interval_s=0.05,
        **kwargs,
    )

    async def stop() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(optimizer.train)
            while not waiting.is_set():
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(stop)


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    log_dir = tmp_path_factory.mktemp("schema") / "logs"
    run_jobs(log_dir)
    files = sorted(log_dir.rglob("events*.jsonl"))
    assert len(files) == 8
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def test_every_record_written_by_real_runs_fits_the_schema(
    records: list[dict[str, Any]],
) -> None:
    problems = {p for record in records for p in check_record(record)}
    assert not problems, sorted(problems)


def test_the_runs_wrote_every_record_a_single_process_can(records: list[dict[str, Any]]) -> None:
    seen = {r["event"] for r in records}
    # Not here: uneven_inputs (several ranks), signal_received and forced_exit (signals to
    # the process), log_degraded (events() only, on a failing disk), compile_decision
    # (compile="auto" on CUDA; its fields are checked in test_compile.py), pending (a run on
    # a Ray cluster waiting for its actor: test_ray_runs.py).
    expected = set(RECORDS) - {
        "pending",
        "uneven_inputs",
        "signal_received",
        "forced_exit",
        "log_degraded",
        "compile_decision",
    }
    if torch.cuda.is_available():  # the plain runs sample a real GPU
        expected.discard("monitor_degraded")
    assert expected <= seen, sorted(expected - seen)

    def values(event: str, field: str) -> set[Any]:
        return {r.get(field) for r in records if r["event"] == event}

    # best_checkpoint_missing: the resume past the damaged checkpoint finds its best pruned.
    kinds = {
        "checkpoint_invalid",
        "nonfinite_validation_loss",
        "callback_failed",
        "best_checkpoint_missing",
    }
    assert values("error", "kind") == kinds
    assert values("run_end", "status") == {"completed", "failed", "cancelled", "abandoned"}
    assert values("step_thread_abandoned", "waiting_for") == {"step"}
    assert {"step", "epoch", "best", "error"} <= values("checkpoint", "reason")
    assert values("checkpoint", "best") == {True, False}
    assert values("gpu_sample", "source") >= {"nvml"}
    assert None in values("validation", "val_loss")  # a NaN loss is null in the file
    assert values("train_step", "overflow") == {True, False}


def valid_checkpoint() -> dict[str, Any]:
    return {
        "event": "checkpoint",
        "ts": "2026-11-22T03:15:00.123456Z",
        "level": "info",
        "run_id": "20261122-031500.123-a1b2c3",
        "rank": 0,
        "path": "ckpt/step-000000004",
        "step": 4,
        "epoch": 0,
        "reason": "step",
        "best": False,
        "save_time_s": 0.01,
    }


def test_check_record_finds_missing_unexpected_and_mistyped_fields() -> None:
    assert check_record(valid_checkpoint()) == []
    missing = valid_checkpoint()
    del missing["step"]
    assert check_record(missing) == ["checkpoint: missing field 'step'"]
    assert check_record(valid_checkpoint() | {"bogus": 1}) == [
        "checkpoint: unexpected field 'bogus'"
    ]
    assert check_record(valid_checkpoint() | {"event": "nope"}) == ["unknown event 'nope'"]
    assert check_record({"step": 1}) == ["unknown event None"]
    wrong = valid_checkpoint() | {"step": "4", "save_time_s": None, "reason": "whim", "rank": True}
    assert len(check_record(wrong)) == 4
    assert check_record(valid_checkpoint() | {"save_time_s": 1}) == []  # an int is a number
    # Optional fields may be absent; null only where the type allows it.
    error = valid_checkpoint() | {"event": "error", "level": "error", "kind": "checkpoint_failed"}
    for field in ("path", "step", "epoch", "best", "save_time_s"):
        del error[field]
    assert check_record(error | {"last_checkpoint": None}) == []
    assert check_record(error | {"reason": None}) == ["error: field 'reason' is None, declared str"]


def test_every_record_and_field_is_described() -> None:
    for event, record_type in RECORDS.items():
        assert record_type.__doc__, event
        assert all(f.doc for f in fields_of(record_type)), event


def test_the_docs_show_the_generated_schema() -> None:
    text = SCHEMA_PAGE.read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    assert text.split(START, 1)[1].split(END, 1)[0] == schema_markdown()
