"""What follows each check of the monitored value: a plateau scheduler steps with it, and
the stopping rules are judged. A check is every validation, or every epoch's end where the
monitored value is the training loss.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.trainer.assembly.build import Parts

__all__ = ("Judge",)


class Judge:
    """The stopping rules and the plateau scheduler of one job."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.monitor = parts.early_stopping.monitor
        self.plateau = parts.plateau

    @property
    def at_epoch_end(self) -> bool:
        """Whether the monitored value is only known at an epoch's end (the training loss)."""
        return not self.monitor.startswith("val_")

    def check(self, values: dict[str, Any], *, epochs: int, stop: threading.Event) -> bool:
        """One check of ``values`` after ``epochs`` epochs; True (and ``stop`` set) to stop."""
        value = values.get(self.monitor)
        if value is None:
            return self.due(epochs=epochs, stop=stop)
        parts = self.parts
        if self.plateau is not None and math.isfinite(value):
            self.plateau.step(float(value))
        reason = parts.early_stopping.judge(
            float(value), epochs=epochs, steps=parts.loop.global_step
        )
        return self._decide(reason, stop)

    def due(self, *, epochs: int, stop: threading.Event) -> bool:
        """At an epoch's end: a rule that fired before ``min_epochs``/``min_steps`` stops
        the run once they are reached."""
        parts = self.parts
        reason = parts.early_stopping.due(epochs=epochs, steps=parts.loop.global_step)
        return self._decide(reason, stop)

    def _decide(self, reason: str | None, stop: threading.Event) -> bool:
        parts = self.parts
        if parts.strategy.world_size > 1:  # rank 0 decides: no rank is left in a collective
            reason = parts.strategy.broadcast_object(reason)
        if reason is None:
            return False
        progress = parts.state.progress
        progress.stopped_early, progress.stop_reason = True, f"early_stopping: {reason}"
        stop.set()
        return True
