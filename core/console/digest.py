"""What the end-of-run summary needs from the records before ``run_end``: the ``run_start``
record, the last epoch and validation, checkpoints, and counts of warnings and errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.callbacks import Record
from core.checks import is_number

__all__ = ("RunDigest", "lookup")


def lookup(record: object, *keys: str) -> object:
    """``record[k1][k2]...``, or ``None`` where a level is missing or not a dict.

    >>> lookup({"resolved": {"strategy": {"device": "cpu"}}}, "resolved", "strategy", "device")
    'cpu'
    """
    for key in keys:
        if not isinstance(record, dict):
            return None
        record = record.get(key)
    return record


@dataclass
class RunDigest:
    """The records of one run folded into what a summary shows; ``update`` never raises
    on a record missing fields (absent fields leave the digest as it was)."""

    run_start: Record | None = None
    last_epoch_end: Record | None = None
    last_validation: Record | None = None
    last_checkpoint: str | None = None
    best_checkpoint: str | None = None
    warnings: int = 0
    errors: int = 0
    last_error: Record | None = None
    train_samples: int = 0
    train_time_s: float = 0.0

    def update(self, record: Record) -> None:
        """Fold one record in (any event; records of other events are counted by level)."""
        event, level = record.get("event"), record.get("level")
        if event == "run_start":
            vars(self).update(vars(RunDigest(run_start=record)))  # a new run: start afresh
        elif event == "epoch_end":
            self.last_epoch_end = record
            samples, seconds = record.get("samples"), record.get("epoch_time_s")
            if is_number(samples) and is_number(seconds):
                self.train_samples += int(samples)
                self.train_time_s += float(seconds)
        elif event == "validation":
            self.last_validation = record
        elif event == "checkpoint" and isinstance(path := record.get("path"), str):
            self.last_checkpoint = path
            if record.get("best") is True:
                self.best_checkpoint = path
        if event == "run_end":
            return  # its level repeats the failure the summary reports anyway
        if level == "warning":
            self.warnings += 1
        elif level == "error":
            self.errors, self.last_error = self.errors + 1, record
