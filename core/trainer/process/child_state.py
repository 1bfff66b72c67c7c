"""What the service knows of its training process's run, read from the records it relays
(``run.isolation="process"``, ``devices=N``): the run's directory, how far it got, its
checkpoints. The job's views (``global_step``, ``last_checkpoint``...) read it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ("ChildState",)


@dataclass
class ChildState:
    """What the service knows of its training process's run, from the records."""

    run_dir: Path | None = None
    global_step: int = 0
    epochs_completed: int = 0
    last_checkpoint: str | None = None
    best_checkpoint: str | None = None
    pid: int | None = None

    def read(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event == "train_step":
            self.global_step = int(record.get("step", self.global_step))
        elif event == "epoch_end":
            self.epochs_completed = int(record.get("epoch", -1)) + 1
        elif event in ("checkpoint", "resumed") and isinstance(record.get("path"), str):
            self.last_checkpoint = record["path"]
