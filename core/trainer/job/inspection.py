"""What a user may read of a built run, without reaching into its parts: the resolved
settings and plan (``run.describe()``), the checkpoints (``run.checkpoints``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from core.checkpointing.lineage import Checkpoints
from core.config import TrainingConfig
from core.telemetry.describe import Fixed, resolved
from core.trainer.assembly.build import Parts
from core.trainer.epochs.plan import plan

__all__ = ("checkpoints_of", "describe")


def describe(config: TrainingConfig, parts: Parts) -> dict[str, Any]:
    """What the config resolved to (as in ``run_start``), and the plan as it stands now."""
    accumulation = parts.accumulation
    return resolved(
        {
            "strategy": parts.strategy,
            "precision": parts.policy,
            "checkpoints": parts.checkpointer,
            "device_settings": Fixed(parts.device_settings),
            "model_setup": Fixed(parts.prepared.describe()),
            "gradient_accumulation": Fixed(
                asdict(config.accumulation)
                | {
                    "accumulation_steps": accumulation.accumulation_steps,
                    "micro_batch_size": accumulation.micro_batch_size,
                }
            ),
            "error_handling": Fixed(asdict(config.errors)),
            "plan": Fixed(plan(config, parts)),
        },
        model=parts.strategy.unwrap(parts.model),
        optimizer=parts.optimizer,
        scheduler=parts.scheduler,
        loss_fn=parts.objective.source,
    )


def checkpoints_of(config: TrainingConfig, parts: Parts) -> Checkpoints:
    progress = parts.state.progress
    return Checkpoints(
        parts.checkpointer.store, lambda: progress.best_checkpoint, config.checkpoint.safe_globals
    )
