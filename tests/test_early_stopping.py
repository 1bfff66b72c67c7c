"""Early stopping's rules as a Lightning user knows them (``EarlyStopping`` callback and the
trainer's ``min_epochs``/``min_steps``), unit by unit and in runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from core import create_optimized_training_optimizer
from core.config import EarlyStoppingConfig
from core.errors import ConfigError
from core.stopping.early_stopping import EarlyStopping
from tests.helpers import loaders, make_model

NAN = float("nan")


def judged(values: list[float], **settings: Any) -> list[str | None]:
    stopper = EarlyStopping(EarlyStoppingConfig(**settings))
    return [stopper.judge(v, epochs=i + 1, steps=10 * (i + 1)) for i, v in enumerate(values)]


def first_stop(values: list[float], **settings: Any) -> int | None:
    """The 1-based check at which the rules stop, as Lightning counts epochs trained."""
    reasons = judged(values, **settings)
    return next((i + 1 for i, reason in enumerate(reasons) if reason), None)


def test_patience_counts_checks_without_improvement() -> None:
    assert first_stop([1.0, 0.9, 0.95, 0.91], patience=2) == 4
    stopper = EarlyStopping(EarlyStoppingConfig(patience=2))
    for value in (1.0, 0.9, 0.95):
        stopper.judge(value, epochs=1, steps=1)
    assert (stopper.best, stopper.bad_epochs) == (0.9, 1)


def test_min_delta_ignores_tiny_improvements_and_no_patience_never_stops() -> None:
    assert first_stop([1.0, 0.95], patience=1, min_delta=0.1) == 2
    assert first_stop([1.0] * 100) is None


def test_a_nan_stops_at_once_by_default_as_lightnings_check_finite() -> None:
    # Lightning, patience 3: [4, 3, nan, 2, 1] stops at the third epoch.
    values = [4.0, 3.0, NAN, 2.0, 1.0, 0.5, 0.4, 0.3]
    assert first_stop(values, patience=3) == 3
    assert judged(values, patience=3)[2] == "val_loss = nan is not finite (best 3)"
    # check_finite=False: a NaN is a bad check that patience counts, and never the best.
    assert first_stop([4.0, NAN, NAN, NAN], patience=3, check_finite=False) == 4


def test_thresholds_stop_at_once() -> None:
    assert first_stop([1.0, 0.5, 0.09, 0.05], stopping_threshold=0.1) == 3
    assert judged([0.09], stopping_threshold=0.1) == [
        "val_loss = 0.09 is better than stopping_threshold 0.1"
    ]
    assert first_stop([1.0, 5.0, 12.0], divergence_threshold=10.0) == 3
    assert judged([12.0], divergence_threshold=10.0) == [
        "val_loss = 12 is worse than divergence_threshold 10"
    ]
    maxed = EarlyStopping(
        EarlyStoppingConfig(stopping_threshold=0.9), mode="max", monitor="val_acc"
    )
    assert [maxed.judge(v, epochs=1, steps=1) for v in (0.5, 0.95)] == [
        None,
        "val_acc = 0.95 is better than stopping_threshold 0.9",
    ]


def test_min_epochs_and_min_steps_hold_a_stop_back() -> None:
    # The rule fires at the second check; min_epochs=4 holds it until the fourth.
    assert first_stop([1.0, 2.0, 3.0, 4.0, 5.0], patience=1, min_epochs=4) == 4
    assert first_stop([1.0, 2.0, 3.0, 4.0, 5.0], patience=1, min_steps=30) == 3  # 10 per check
    stopper = EarlyStopping(EarlyStoppingConfig(patience=1, min_epochs=3))
    stopper.judge(1.0, epochs=1, steps=1)
    assert stopper.judge(2.0, epochs=1, steps=2) is None  # fired, held
    assert stopper.due(epochs=3, steps=3) is not None  # the epoch end that reaches min_epochs


def test_state_round_trips_with_a_held_stop() -> None:
    stopper = EarlyStopping(EarlyStoppingConfig(patience=1, min_epochs=5))
    stopper.judge(1.0, epochs=1, steps=1)
    stopper.judge(2.0, epochs=1, steps=2)
    restored = EarlyStopping(EarlyStoppingConfig(patience=1, min_epochs=5))
    restored.load_state_dict(stopper.state_dict())
    assert (restored.best, restored.bad_epochs, restored.pending) == (
        1.0,
        1,
        stopper.pending,
    )
    assert restored.due(epochs=5, steps=9) == stopper.pending


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"stopping_threshold=nan is invalid.*finite number"):
        EarlyStoppingConfig(stopping_threshold=NAN)
    with pytest.raises(ConfigError, match=r"min_epochs=-1 is invalid"):
        EarlyStoppingConfig(min_epochs=-1)
    with pytest.raises(ConfigError, match=r"check_finite='yes' is invalid"):
        EarlyStoppingConfig(check_finite="yes")  # type: ignore[arg-type]
    assert not EarlyStoppingConfig().enabled
    assert EarlyStoppingConfig(divergence_threshold=3.0).enabled


class Scripted(nn.Module):
    """A model whose validation loss follows a script: ``losses[k]`` at the k-th validation
    (0-based), whatever the weights. The loss is ``MSE(outputs, 0)`` of a constant output."""

    def __init__(self, losses: list[float]) -> None:
        super().__init__()
        self.inner = make_model()
        self.losses = losses
        self.validations = -1
        self.was_training = True

    def forward(self, x: Any) -> Any:
        if self.training:
            self.was_training = True
            return self.inner(x)
        if self.was_training:  # the first batch of a new validation
            self.was_training = False
            self.validations += 1
        value = self.losses[min(self.validations, len(self.losses) - 1)]
        level = math.sqrt(value) if math.isfinite(value) else value  # MSE to 0: the value
        return (self.inner(x) * 0).sum(dim=1, keepdim=True) + level


def scripted_loss(outputs: Any, targets: Any) -> Any:
    return (
        (outputs**2).mean()
        if outputs.shape[1] == 1
        else nn.functional.cross_entropy(outputs, targets)
    )


def run_scripted(
    tmp_path: Path, losses: list[float], **settings: Any
) -> tuple[Any, list[dict[str, Any]]]:
    import anyio

    train, val = loaders(n=64, batch_size=16)
    settings.setdefault("num_sanity_val_steps", 0)  # the script counts every validation pass
    job = create_optimized_training_optimizer(
        model=Scripted(losses),
        train_loader=train,
        val_loader=val,
        loss_fn=scripted_loss,
        log_dir=tmp_path,
        experiment_name="stopping",
        max_epochs=len(losses),
        progress=False,
        **settings,
    )
    records: list[dict[str, Any]] = []

    async def main() -> Any:
        async def collect() -> None:
            async for record in job.events():
                records.append(record)

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            results = await job.train()
        return results

    return anyio.run(main), records


def test_a_run_stops_at_the_first_nan_and_says_why(tmp_path: Path) -> None:
    losses = [4.0, 3.0, NAN, 2.0, 1.0, 0.5, 0.4, 0.3]
    results, records = run_scripted(tmp_path, losses, early_stopping_patience=3)
    assert results.epochs_completed == 3
    assert results.stopped_early
    end = records[-1]
    assert end["event"] == "run_end" and end["status"] == "completed"
    assert (
        end["stop_reason"]
        == results.stop_reason
        == ("early_stopping: val_loss = nan is not finite (best 3)")
    )


def test_every_step_validation_is_judged(tmp_path: Path) -> None:
    # 4 steps an epoch, validated every 2 steps: the 3rd validation (step 6, in the middle
    # of the second epoch) is the first without improvement; patience 1 stops there.
    results, records = run_scripted(
        tmp_path,
        [1.0, 0.5, 0.6, 0.1, 0.1, 0.1],
        early_stopping_patience=1,
        val_every_n_steps=2,
        val_every_n_epochs=None,
    )
    validations = [r for r in records if r["event"] == "validation"]
    assert [r["step"] for r in validations] == [2, 4, 6]
    assert (results.global_step, results.epochs_completed) == (6, 1)
    assert results.stopped_early and "did not improve in 1 validation (best" in results.stop_reason
    stop = [r for r in records if r["event"] == "checkpoint" and r["reason"] == "early_stop"]
    assert [r["step"] for r in stop] == [6]


def test_min_epochs_holds_the_stop_until_reached(tmp_path: Path) -> None:
    losses = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    results, _ = run_scripted(tmp_path, losses, early_stopping_patience=1, min_epochs=4)
    assert results.epochs_completed == 4 and results.stopped_early


def test_thresholds_end_a_run(tmp_path: Path) -> None:
    # Strictly better, as Lightning compares: the ties of epochs 2 and 3 go on (0.25 is
    # exact in float32, so the scripted value is the threshold itself).
    results, _ = run_scripted(tmp_path, [1.0, 0.25, 0.25, 0.01], stopping_threshold=0.25)
    assert results.epochs_completed == 4
    assert results.stop_reason == (
        "early_stopping: val_loss = 0.01 is better than stopping_threshold 0.25"
    )
    results, _ = run_scripted(tmp_path / "d", [1.0, 50.0, 0.1], divergence_threshold=10.0)
    assert results.epochs_completed == 2
    assert "worse than divergence_threshold 10" in results.stop_reason
