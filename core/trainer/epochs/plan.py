"""What ``run_start`` says about the run ahead: the plan, the model, and its lineage."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import TrainingConfig
from core.distributed.lockstep import batches_in
from core.telemetry.init_hash import HASH_METHOD, previous_init_hash

if TYPE_CHECKING:
    from core.trainer.assembly.build import Parts

__all__ = ("lineage", "plan")


def plan(config: TrainingConfig, parts: Parts) -> dict[str, Any]:
    """The ``plan`` field of ``run_start`` (None where a loader has no length)."""
    loader = parts.train_loader
    batches = batches_in(loader)
    steps = config.accumulation.accumulation_steps
    per_step = getattr(loader, "batch_size", None)
    world = parts.strategy.world_size
    return {
        "max_epochs": config.run.max_epochs,
        "max_steps": config.run.max_steps,
        "batches_per_epoch": batches,
        "steps_per_epoch": None if batches is None else math.ceil(batches / steps),
        "effective_batch_size": per_step * steps * world if isinstance(per_step, int) else None,
        "world_size": world,
        "has_validation": parts.val_loader is not None,
        "val_every_n_epochs": config.run.val_every_n_epochs,
        "val_every_n_steps": config.run.val_every_n_steps,
        "save_best": config.checkpoint.tracks_best,
        "save_top_k": config.checkpoint.top_k,
        "monitor": config.checkpoint.monitor,
        "mode": config.checkpoint.mode,
    }


def lineage(parts: Parts, run_dir: Path, run_id: str) -> dict[str, Any]:
    """``model_init_hash`` and whether it matches the previous run of the experiment (``seed=``
    alone does not seed a model built before the run: :func:`core.seed_everything` does)."""
    previous = previous_init_hash(run_dir.parent, run_id)
    mine = parts.init_hash
    return {
        "model_init_hash": mine,
        "model_init_hash_method": HASH_METHOD,
        "model_init_matches_previous": None if previous is None else previous == mine,
    }
