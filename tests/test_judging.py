"""After each check of the monitored value: a plateau scheduler steps with it (and is saved
and resumed exactly), as Lightning steps ``ReduceLROnPlateau`` with its ``monitor``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import torch

from core import create_optimized_training_optimizer
from tests.helpers import loaders, make_model
from tests.test_early_stopping import run_scripted


def halving(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)


def lr_by_epoch(records: list[dict[str, Any]]) -> dict[int, set[float]]:
    lrs: dict[int, set[float]] = {}
    for record in records:
        if record["event"] == "train_step":
            lrs.setdefault(record["epoch"], set()).add(record["lr"])
    return lrs


def test_a_plateau_scheduler_steps_after_each_validation_with_the_monitored_value(
    tmp_path: Path,
) -> None:
    # Validation losses 1, 2, 3, 0.5: the 2nd and 3rd do not improve, each halves the LR.
    _, records = run_scripted(tmp_path, [1.0, 2.0, 3.0, 0.5], scheduler=halving, learning_rate=0.1)
    assert lr_by_epoch(records) == {0: {0.1}, 1: {0.1}, 2: {0.05}, 3: {0.025}}


def test_a_plateau_scheduler_follows_step_validations_too(tmp_path: Path) -> None:
    _, records = run_scripted(
        tmp_path,
        [1.0, 2.0, 3.0, 4.0],
        scheduler=halving,
        learning_rate=0.1,
        val_every_n_steps=2,
        val_every_n_epochs=None,
    )
    steps = [r for r in records if r["event"] == "train_step"]
    # Validated after steps 2, 4, 6: from the second on, each halves the LR.
    assert [r["lr"] for r in steps[:8]] == [0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.025, 0.025]


def run(log_dir: Path, max_epochs: int) -> tuple[Any, list[dict[str, Any]]]:
    train, val = loaders(n=64, batch_size=16)

    def never_better(optimizer: torch.optim.Optimizer) -> Any:
        # An improvement must beat the best by 10: only the first value counts, so the
        # count of bad validations decides when the LR drops (a fresh one would differ).
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, factor=0.5, patience=1, threshold=10.0, threshold_mode="abs"
        )

    job = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=train,
        val_loader=val,
        scheduler=never_better,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        max_epochs=max_epochs,
        seed=0,
        log_dir=log_dir,
        experiment_name="plateau",
        resume="auto",
        progress=False,
    )
    records: list[dict[str, Any]] = []

    async def main() -> None:
        async def collect() -> None:
            async for record in job.events():
                records.append(record)

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            await job.train()

    anyio.run(main)
    return job, records


def test_a_plateau_scheduler_is_saved_and_resumed_exactly(tmp_path: Path) -> None:
    straight, straight_records = run(tmp_path / "straight", max_epochs=5)
    _, first = run(tmp_path / "resumed", max_epochs=2)
    resumed, second = run(tmp_path / "resumed", max_epochs=5)
    assert lr_by_epoch(first) | lr_by_epoch(second) == lr_by_epoch(straight_records)
    # Bad validations after epochs 1 and 2 drop the LR for epoch 3: the resumed run counts
    # the one before its restart.
    assert lr_by_epoch(straight_records) == {0: {0.1}, 1: {0.1}, 2: {0.1}, 3: {0.05}, 4: {0.05}}
    ours, theirs = resumed.model.state_dict(), straight.model.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
