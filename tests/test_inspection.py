"""The documented way to inspect a run: ``run.checkpoints``, ``run.strategy_name`` and the
plan in ``run.describe()``; nothing here reaches into a run's private parts."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch.utils.data import DataLoader

from core import (
    CheckpointError,
    CheckpointInfo,
    GradientAccumulationConfig,
    OptimizedTrainingOptimizer,
    create_optimized_training_optimizer,
)
from tests.helpers import loaders, make_classification, make_model


def build(log_dir: Path, **kwargs: Any) -> OptimizedTrainingOptimizer:
    train_loader, val_loader = loaders(n=128, batch_size=16)
    settings = (
        dict(
            model=make_model(),
            train_loader=train_loader,
            val_loader=val_loader,
            max_epochs=2,
            log_dir=log_dir,
            checkpoint_every_n_steps=4,
            keep_last_n=2,
            save_best=True,
            seed=0,
        )
        | kwargs
    )
    return create_optimized_training_optimizer(**settings)


def test_checkpoints_list_latest_best_verify_load_and_lineage(tmp_path: Path) -> None:
    run = build(tmp_path)
    results = anyio.run(run.train)
    checkpoints = run.checkpoints
    listed = list(checkpoints)
    assert listed and all(isinstance(c, CheckpointInfo) for c in listed)
    commits = [c.committed_at_ns for c in listed]
    assert commits == sorted(commits, reverse=True)  # the last committed first
    assert {c.run_id for c in listed} == {run.run_dir.name}
    latest = checkpoints.latest
    assert latest == listed[0] and str(latest.path) == run.last_checkpoint
    assert latest.step == run.global_step and latest.reason in ("step", "epoch", "best")
    best = checkpoints.best
    assert best is not None and best.best and str(best.path) == results.best_checkpoint
    assert [c for c in listed if c.best] == [best]
    assert checkpoints.verify(latest) == latest
    fresh = make_model()
    loaded = checkpoints.load(best, fresh)
    assert loaded.step == best.step and loaded.path == best.path
    # A damaged checkpoint: verify says so, latest falls back to the one before it.
    state = latest.path / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(CheckpointError):
        checkpoints.verify(latest)
    assert checkpoints.latest == listed[1]
    with pytest.raises(CheckpointError, match=r"not a committed checkpoint .* allowed"):
        checkpoints.verify(tmp_path / "nope")
    # A resumed run's checkpoints lead back through the one it resumed from.
    resumed = build(tmp_path, resume="auto", max_epochs=3)
    anyio.run(resumed.train)
    chain = resumed.checkpoints.lineage()
    assert chain[0] == resumed.checkpoints.latest
    assert chain[0].run_id == resumed.run_dir.name
    assert all(later.parent == earlier.name for later, earlier in itertools.pairwise(chain))
    assert chain[0].parent == listed[1].name  # the checkpoint it resumed from
    # One lineage, its retention counted over both runs: the damaged one is pruned.
    assert {c.lineage for c in resumed.checkpoints} == {run.run_dir.name}
    assert len(resumed.checkpoints) <= 2 + 1 and not listed[0].path.exists()


def test_strategy_name_and_the_resolved_plan(tmp_path: Path) -> None:
    run = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=DataLoader(make_classification(96), batch_size=16),
        max_epochs=1,
        log_dir=tmp_path,
        gradient_accumulation_config=GradientAccumulationConfig(2, micro_batch_size=4),
    )
    run.build()
    assert run.strategy_name == ("single_gpu" if torch.cuda.is_available() else "cpu")
    described = run.describe()
    plan = described["plan"]
    assert plan["batches_per_epoch"] == 6 and plan["steps_per_epoch"] == 3
    assert plan["effective_batch_size"] == 32 and plan["world_size"] == 1
    accumulation = described["gradient_accumulation"]
    assert accumulation["accumulation_steps"] == 2 and accumulation["micro_batch_size"] == 4
