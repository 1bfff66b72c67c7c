from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch import nn

from core import (
    ConfigError,
    MixedPrecisionConfig,
    MixedPrecisionTrainer,
    create_optimized_training_optimizer,
)
from core.config import TrainingConfig
from core.loop.recovery import ErrorHandlerConfig
from core.precision.config import LossScalerConfig
from core.precision.plugins import FP32, Autocast, ScaledFP16
from core.precision.policy import resolve_precision
from tests.helpers import loaders, make_model

CPU = torch.device("cpu")


class InfInjector(nn.Module):
    """Makes every gradient of chosen forward calls infinite; snapshots weights per call."""

    def __init__(self, inner: nn.Module, inject: set[int] | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.inject = inject  # None: every call
        self.calls = 0
        self.snapshots: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.snapshots.append(next(self.inner.parameters()).detach().clone())
        out: torch.Tensor = self.inner(x)
        if self.training and (self.inject is None or self.calls in self.inject):
            out.register_hook(lambda g: torch.full_like(g, float("inf")))
        return out


def train(model: nn.Module, log_dir: Path, **kwargs: Any) -> Any:
    train_loader, _ = loaders(n=128, batch_size=16)
    defaults: dict[str, Any] = {"max_epochs": 1, "log_dir": log_dir, "amp_dtype": torch.float16}
    optimizer = create_optimized_training_optimizer(
        model=model, train_loader=train_loader, **(defaults | kwargs)
    )
    return optimizer, anyio.run(optimizer.train)


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        ("growth_factor", 1.0, r"growth_factor=1.0 is invalid; allowed: a float > 1.0"),
        ("backoff_factor", 1.5, r"backoff_factor=1.5 is invalid"),
        ("growth_interval", 0, r"growth_interval=0 is invalid; allowed: an integer >= 1"),
        ("hysteresis", 0, r"hysteresis=0 is invalid; allowed: an integer >= 1"),
        ("min_scale", 0.0, r"min_scale=0.0 is invalid"),
        ("init_scale", 2.0**30, r"init_scale=1073741824.0 is invalid"),
    ],
)
def test_config_errors_name_the_field(field: str, value: object, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        LossScalerConfig(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=pattern):
        MixedPrecisionConfig(dtype="fp16", scaler=LossScalerConfig(**{field: value}))  # type: ignore[arg-type]


def test_config_errors_through_the_tree_name_the_dotted_path() -> None:
    with pytest.raises(ConfigError, match=r"^precision\.scaler\.min_scale=0\.0 is invalid"):
        TrainingConfig().replace({"precision.scaler.min_scale": 0.0})
    with pytest.raises(ConfigError, match=r"^precision\.dtype='float8' is invalid; allowed"):
        TrainingConfig().replace({"precision.dtype": "float8"})
    with pytest.raises(ConfigError, match=r"^amp_min_scale=0\.0 is invalid"):
        create_optimized_training_optimizer(model=make_model(), train_loader=[], amp_min_scale=0.0)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("auto", FP32),
        (torch.float32, FP32),
        ("bf16", Autocast),
        (torch.bfloat16, Autocast),
        ("float16", ScaledFP16),
    ],
)
def test_resolution_on_cpu(dtype: Any, expected: type) -> None:
    assert type(resolve_precision(MixedPrecisionConfig(dtype=dtype), CPU)) is expected


def test_fp16_without_scaler_and_amp_disabled() -> None:
    unscaled = resolve_precision(MixedPrecisionConfig(dtype="fp16", enable_grad_scaler=False), CPU)
    assert type(unscaled) is Autocast and unscaled.dtype == torch.float16
    assert (
        type(resolve_precision(MixedPrecisionConfig(enable_amp=False, dtype="bf16"), CPU)) is FP32
    )


def test_autocast_runs_matmuls_in_the_chosen_dtype() -> None:
    for dtype in (torch.bfloat16, torch.float16):
        precision = resolve_precision(MixedPrecisionConfig(dtype=dtype), CPU)
        with precision.autocast():
            out = nn.Linear(4, 4)(torch.randn(2, 4))
        assert out.dtype == dtype


def test_toggle_takes_effect_at_the_next_step_and_is_counted() -> None:
    trainer = MixedPrecisionTrainer(MixedPrecisionConfig(dtype="bf16"), CPU)
    assert trainer.begin_step().name == "bf16"
    trainer.disable_amp()
    assert trainer.precision.name == "bf16"  # current step unchanged
    assert trainer.begin_step().name == "fp32"
    assert trainer.toggle_amp() is True
    assert trainer.begin_step().name == "bf16"
    stats = trainer.get_amp_stats()
    assert stats["total_steps"] == 3
    assert stats["amp_steps"] == 2
    assert stats["amp_usage_ratio"] == pytest.approx(2 / 3)


def test_amp_stats_keys_and_json_file(tmp_path: Path) -> None:
    config = MixedPrecisionConfig(dtype="fp16", scaler=LossScalerConfig(init_scale=128.0))
    trainer = MixedPrecisionTrainer(config, CPU)
    trainer.begin_step()
    trainer.record_step(overflow=True, skipped=True, step_time_s=0.5, counts_scaler_update=True)
    path = trainer.save_amp_stats(tmp_path / "stats" / "amp_stats.json")
    stats = json.loads(path.read_text())
    assert set(stats) >= {
        "total_steps",
        "amp_steps",
        "scaler_updates",
        "overflow_count",
        "skipped_steps",
        "current_scale",
        "amp_usage_ratio",
        "overflow_ratio",
        "avg_step_time",
    }
    assert stats["overflow_count"] == 1 and stats["skipped_steps"] == 1
    assert stats["overflow_ratio"] == 1.0 and stats["avg_step_time"] == 0.5
    assert stats["current_scale"] == 128.0


def test_fp16_overflowing_steps_are_skipped_and_scheduler_does_not_move(log_dir: Path) -> None:
    model = InfInjector(make_model())
    before = [p.detach().clone() for p in model.parameters()]
    optimizer, results = train(
        model,
        log_dir,
        amp_hysteresis=3,
        amp_init_scale=2.0**10,
        scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
    )
    assert results.global_step == 8
    for old, new in zip(before, model.parameters(), strict=True):
        assert torch.equal(old, new)
    assert optimizer.scheduler.last_epoch == 0
    assert optimizer.optimizer.param_groups[0]["lr"] == 1e-3
    stats = optimizer.mixed_precision.get_amp_stats()
    assert stats["skipped_steps"] == stats["overflow_count"] == 8
    # 8 overflows with hysteresis 3 (DeepSpeed's meaning): the 3rd backs off, and, with no
    # clean steps to refill the budget, so does every one after it: 2**10 -> 2**9 ... -> 2**4.
    assert stats["current_scale"] == 2.0**4
    records = [
        json.loads(line) for line in (results.run_dir / "events.jsonl").read_text().splitlines()
    ]
    scales = [r["loss_scale"] for r in records if r["event"] == "train_step"]
    assert scales == [2.0**10] * 3 + [2.0**9, 2.0**8, 2.0**7, 2.0**6, 2.0**5]


def test_fp16_scale_stops_at_min_scale(log_dir: Path) -> None:
    optimizer, _ = train(
        InfInjector(make_model()),
        log_dir,
        amp_init_scale=8.0,
        amp_min_scale=2.0,
        error_handler_config=ErrorHandlerConfig(precision_fallback=False),
    )
    assert optimizer.mixed_precision.get_amp_stats()["current_scale"] == 2.0


def test_one_overflow_skips_exactly_that_step(log_dir: Path) -> None:
    model = InfInjector(make_model(), inject={3})
    optimizer, results = train(
        model,
        log_dir,
        scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.9),
    )
    snaps = model.snapshots
    assert torch.equal(snaps[2], snaps[3])  # the weights seen by call 4 are those of call 3
    assert not torch.equal(snaps[1], snaps[2])
    assert not torch.equal(snaps[3], snaps[4])
    assert optimizer.scheduler.last_epoch == results.global_step - 1
    stats = optimizer.mixed_precision.get_amp_stats()
    assert stats["skipped_steps"] == 1 and stats["overflow_ratio"] == pytest.approx(1 / 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_each_precision_lowers_the_loss(dtype: torch.dtype, log_dir: Path) -> None:
    train_loader, _ = loaders(n=256, batch_size=32, shuffle=True)
    optimizer = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=train_loader,
        amp_dtype=dtype,
        max_epochs=6,
        learning_rate=1e-2,
        log_dir=log_dir,
        seed=0,
    )
    results = anyio.run(optimizer.train)
    records = [json.loads(x) for x in (results.run_dir / "events.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in records if r["event"] == "epoch_end"]
    assert losses[-1] < 0.6 * losses[0]
    assert (
        optimizer.mixed_precision.get_amp_stats()["precision"]
        == {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    )


def test_the_policy_s_former_name_still_imports_with_a_warning() -> None:
    from core.precision import policy

    with pytest.warns(DeprecationWarning, match="now PrecisionPolicy"):
        former = policy.MixedPrecisionTrainer
    assert former is policy.PrecisionPolicy
    with pytest.raises(AttributeError, match="no attribute 'Missing'"):
        _ = policy.Missing
