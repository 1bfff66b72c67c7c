from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from core import (
    ConfigError,
    ErrorHandlerConfig,
    TrainingStepError,
    create_optimized_training_optimizer,
)
from core.checkpointing.store import CheckpointStore
from core.errors import DistributedTimeoutError, NonFiniteLossError, OutOfMemoryError
from core.loop.recovery import ErrorHandler, is_collective_failure, is_out_of_memory
from tests.helpers import make_classification, make_model


class BrokenAt(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A dataset whose sample ``bad`` cannot be read."""

    def __init__(self, bad: int) -> None:
        self.data, self.bad = make_classification(128), bad

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == self.bad:
            raise OSError(f"cannot decode sample {i}")
        x, y = self.data[i]
        return x, y


class FailsAtCall(nn.Module):
    def __init__(self, call: int) -> None:
        super().__init__()
        self.net, self.call, self.calls = make_model(), call, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.call:
            raise ValueError("shapes do not match in layer 3")
        out: torch.Tensor = self.net(x)
        return out


def train(log_dir: Path, **kwargs: Any) -> Any:
    defaults: dict[str, Any] = {
        "model": make_model(),
        "train_loader": DataLoader(make_classification(128), batch_size=16),
        "max_epochs": 1,
        "log_dir": log_dir,
        "checkpoint_every_n_epochs": None,
    }
    return create_optimized_training_optimizer(**(defaults | kwargs))


def test_a_loader_exception_names_epoch_step_and_batch_and_checkpoints_first(log_dir: Path) -> None:
    # Loaded in-process (a worker's error reads "Caught OSError in DataLoader worker process").
    loader = DataLoader(BrokenAt(bad=83), batch_size=16)
    optimizer = train(log_dir, train_loader=loader, rebuild_loaders=False)
    with pytest.raises(
        TrainingStepError,
        match=r"loading a batch failed in epoch 0, step 6, batch 5: OSError: cannot decode",
    ) as caught:
        anyio.run(optimizer.train)
    assert isinstance(caught.value.__cause__, OSError)
    store = CheckpointStore(log_dir / "experiment" / "checkpoints", keep_last_n=2)
    (saved,) = store.committed()
    assert store.verify(saved)["reason"] == "error"
    assert store.load_state(saved)["trainer"]["global_step"] == 5  # the last completed step


def loss_failing_at(call: int) -> Any:
    calls = [0]

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == call:
            raise ValueError("targets out of range")
        return nn.functional.cross_entropy(outputs, targets)

    return loss_fn


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (lambda: {"model": FailsAtCall(call=3)}, "the step"),  # the model's forward
        (lambda: {"loss_fn": loss_failing_at(3)}, "loss_fn"),
    ],
    ids=["model", "loss_fn"],
)
def test_a_model_exception_names_where_it_happened(
    log_dir: Path, settings: Any, named: str
) -> None:
    optimizer = train(log_dir, **settings())
    with pytest.raises(
        TrainingStepError, match=rf"^{named} failed in epoch 0, step 3, batch 2: ValueError"
    ):
        anyio.run(optimizer.train)
    log = [json.loads(x) for x in (optimizer.run_dir / "events.jsonl").read_text().splitlines()]
    assert log[-1]["event"] == "run_end" and log[-1]["status"] == "failed"
    assert log[-1]["error_type"] == "TrainingStepError"


@pytest.mark.parametrize(
    ("exc", "oom"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"
            ),
            True,
        ),
        (MemoryError("Cannot allocate memory"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    ],
)
def test_out_of_memory_is_recognised_in_its_message_forms(exc: BaseException, oom: bool) -> None:
    assert is_out_of_memory(exc) is oom


def test_collective_failures_become_distributed_timeout_errors() -> None:
    gloo = RuntimeError(
        "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv"
    )
    assert is_collective_failure(gloo)
    error = ErrorHandler().step_error(
        gloo, epoch=1, step=7, batch_index=3, rank=1, timeout_s=5.0, phase="the step"
    )
    assert isinstance(error, DistributedTimeoutError)
    assert (
        "rank 1: a collective (the step, epoch 1, step 7) did not finish within timeout_s=5"
        in str(error)
    )
    plain = ErrorHandler().step_error(
        gloo, epoch=1, step=7, batch_index=3, rank=0, timeout_s=None, phase="x"
    )
    assert isinstance(plain, TrainingStepError)  # one process: no collective to blame


def test_an_oom_where_re_splitting_is_off_is_named_as_such() -> None:
    error = ErrorHandler().step_error(
        torch.OutOfMemoryError("CUDA out of memory"),
        epoch=0,
        step=3,
        batch_index=2,
        rank=1,
        timeout_s=60.0,
        phase="the step",
    )
    assert isinstance(error, OutOfMemoryError)
    assert "rank 1 ran out of memory in epoch 0, step 3, batch 2" in str(error)


def test_consecutive_nonfinite_steps_and_fallback_decisions() -> None:
    handler = ErrorHandler(
        ErrorHandlerConfig(max_consecutive_nonfinite=3, overflows_at_min_scale_before_fallback=2)
    )
    common = {"overflow": False, "loss_scale": None, "min_scale": 1.0}
    assert handler.after_step(step=1, skipped=True, **common) is False
    assert handler.after_step(step=2, skipped=False, **common) is False  # the count restarts
    handler.after_step(step=3, skipped=True, **common)
    handler.after_step(step=4, skipped=True, **common)
    with pytest.raises(NonFiniteLossError, match="3 optimizer steps in a row, the last at step 5"):
        handler.after_step(step=5, skipped=True, **common)
    fp16 = {"skipped": True, "overflow": True, "min_scale": 1.0}
    assert handler.after_step(step=6, loss_scale=2.0, **fp16) is False  # not yet at min_scale
    assert handler.after_step(step=7, loss_scale=1.0, **fp16) is False
    assert handler.after_step(step=8, loss_scale=1.0, **fp16) is True


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"max_consecutive_nonfinite": 0}, r"max_consecutive_nonfinite=0 is invalid"),
        (
            {"oom_recovery": "maybe"},
            r"oom_recovery='maybe' is invalid; allowed: 'auto', 'on', 'off'",
        ),
    ],
)
def test_config_errors(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        ErrorHandlerConfig(**kwargs)
