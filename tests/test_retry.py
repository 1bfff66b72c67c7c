"""Re-splitting after an out-of-memory error (core.loop.retry): the same weights as a run
started at the smaller micro-batch (dropout included), thrashing, and the policy choice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from core import ConfigError, GradientAccumulationConfig, create_optimized_training_optimizer
from core.distributed import Strategy
from core.errors import OutOfMemoryError
from core.hardware.device import device_of
from core.loop.recovery import ErrorHandler, ErrorHandlerConfig
from core.loop.retry import AgreedRetry, LocalRetry, NoRetry, retry_policy
from tests.helpers import make_classification


class DropoutOOMAbove(nn.Module):
    """An MLP with dropout that raises torch.OutOfMemoryError above ``limit`` samples, after
    its first layer and dropout have drawn from the RNG (as a real OOM mid-forward would)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.3))
        self.second = nn.Linear(32, 2)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        out: torch.Tensor = self.second(hidden)
        return out


def run(model: nn.Module, micro: int | None, log_dir: Path, accumulation: int = 2) -> Any:
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(make_classification(96), batch_size=32),
        max_epochs=2,
        learning_rate=1e-2,
        log_dir=log_dir,
        seed=0,
        gradient_accumulation_config=GradientAccumulationConfig(
            accumulation, micro_batch_size=micro
        ),
    )
    return optimizer, anyio.run(optimizer.train)


# One batch a step runs inline and turns to micro-batches after the error; two run as
# micro-batches throughout.
@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_recovered_run_equals_a_run_started_at_the_smaller_micro_batch_with_dropout(
    log_dir: Path, accumulation: int
) -> None:
    recovered, results = run(DropoutOOMAbove(limit=10), None, log_dir, accumulation)
    assert recovered.describe()["gradient_accumulation"]["micro_batch_size"] == 8  # 32 -> 16 -> 8
    log = [json.loads(x) for x in (results.run_dir / "events.jsonl").read_text().splitlines()]
    assert [r["micro_batch_size"] for r in log if r["event"] == "oom_recovered"] == [16, 8]
    reference, _ = run(DropoutOOMAbove(limit=10), 8, log_dir, accumulation)
    for a, b in zip(recovered.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_without_the_rewind_dropout_would_differ(log_dir: Path) -> None:
    """Guards the test above: the failed attempt's draws shift every later mask."""
    torch.manual_seed(1)
    x = torch.randn(32, 8)
    model = DropoutOOMAbove(limit=100)
    torch.manual_seed(5)
    clean = model(x[:8])
    torch.manual_seed(5)
    model.first(x)  # a failed attempt at 32 samples draws first
    shifted = model(x[:8])
    assert not torch.equal(clean, shifted)


def test_oom_in_consecutive_steps_is_thrashing() -> None:
    errors = ErrorHandler(ErrorHandlerConfig(oom_thrash_steps=3))
    retry = LocalRetry(device_of(torch.device("cpu")), errors)
    retry.rng = [generator.get_state() for generator in retry.generators]
    retry.rewind(4, 16)
    retry.rewind(4, 8)  # the same step again: one step in the streak
    retry.rewind(6, 4)  # not consecutive: the streak restarts
    retry.rewind(7, 2)
    with pytest.raises(
        OutOfMemoryError,
        match=r"out of memory in 3 optimizer steps in a row \(steps 6 to 8; micro-batches "
        r"halved to 4 -> 2 -> 1\): memory grows from step to step",
    ):
        retry.rewind(8, 1)


def test_the_rewind_restores_the_generator() -> None:
    retry = LocalRetry(device_of(torch.device("cpu")), ErrorHandler())
    retry.rng = [generator.get_state() for generator in retry.generators]
    first = torch.rand(3)
    retry.rewind(1, 4)
    assert torch.equal(torch.rand(3), first)


class TwoRanks(Strategy):
    """A stand-in for a two-rank strategy, for the policy choice only (no collectives)."""

    def __init__(self, agree: bool) -> None:
        super().__init__(torch.device("cpu"), "fsdp" if not agree else "distributed")
        self.can_agree_on_oom = agree

    @property
    def world_size(self) -> int:
        return 2


def test_the_policy_follows_the_setting_and_the_strategy() -> None:
    cpu = device_of(torch.device("cpu"))

    def policy(strategy: Strategy, setting: str) -> object:
        config = ErrorHandlerConfig(oom_recovery=setting)  # type: ignore[arg-type]
        return type(retry_policy(strategy, cpu, ErrorHandler(config)))

    one = Strategy(torch.device("cpu"))
    assert policy(one, "auto") is LocalRetry and policy(one, "off") is NoRetry
    assert policy(TwoRanks(True), "auto") is NoRetry
    assert policy(TwoRanks(True), "on") is AgreedRetry
    with pytest.raises(
        ConfigError,
        match=r"oom_recovery='on' is not supported with "
        r"training_mode='fsdp'",
    ):
        policy(TwoRanks(False), "on")
