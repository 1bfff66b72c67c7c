"""What the service knows of its training process's run, read from the records it relays
(``run.isolation="process"``, ``devices=N``): the run's directory and id, how far it got,
the checkpoint it resumed from and those it wrote."""

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
    run_id: str | None = None
    resumed_from: str | None = None

    @property
    def own_run_id(self) -> str | None:
        """The run's id, from its records or, before any arrived, its directory's name."""
        return self.run_id or (self.run_dir.name if self.run_dir is not None else None)

    def read(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event == "run_start" and isinstance(record.get("run_id"), str):
            self.run_id, self.resumed_from = record["run_id"], None
        elif event == "train_step":
            self.global_step = int(record.get("step", self.global_step))
        elif event == "epoch_end":
            self.epochs_completed = int(record.get("epoch", -1)) + 1
        elif event in ("checkpoint", "resumed") and isinstance(record.get("path"), str):
            self.last_checkpoint = record["path"]
            if event == "resumed":
                self.resumed_from = record["path"]
