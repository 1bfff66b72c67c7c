"""The checkpointer of a run that must leave nothing to resume: a ``fast_dev_run``.

Nothing is due, saved or looked for; the checkpoint directory is not created.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typing_extensions import override

from core.checkpointing.checkpointer import Checkpointer

__all__ = ("NoCheckpoints",)


class NoCheckpoints(Checkpointer):
    """A :class:`Checkpointer` that never writes or reads a checkpoint."""

    @override
    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "saves": False, "why": "fast_dev_run: nothing saved"}

    @override
    def due_after_step(self, global_step: int) -> bool:
        return False

    @override
    def due_after_epoch(self, epochs_completed: int) -> bool:
        return False

    @override
    def save(self, **_: Any) -> Path | None:
        return None

    @override
    def keep_best(self, *_: Any, **__: Any) -> None:
        return None

    @override
    def restore(self) -> dict[str, Any] | None:
        return None
