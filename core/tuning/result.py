"""What a learning-rate range test found: the curve, the suggested rate and why."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.tuning.config import LRFinderConfig
from core.tuning.plot import write_lr_plot

__all__ = ("LRFinderResult",)


@dataclass(frozen=True)
class LRFinderResult:
    """One range test: ``lrs[i]`` is the learning rate of step ``i``, ``losses[i]`` the
    loss of the batch that step trained on, ``smoothed_losses[i]`` its bias-corrected
    moving average. ``suggestion`` is the rate to train with (None after a sweep shorter
    than ``MIN_STEPS``), ``reason`` says how it was read off the curve, ``stopped`` why the
    sweep ended, ``min_loss_lr`` where the smoothed loss was lowest."""

    lrs: tuple[float, ...]
    losses: tuple[float, ...]
    smoothed_losses: tuple[float, ...]
    suggestion: float | None
    reason: str
    stopped: str
    min_loss_lr: float
    config: LRFinderConfig
    device: str = "cpu"
    precision: str = "fp32"

    @property
    def steps(self) -> int:
        """The steps that ran (fewer than ``config.num_steps`` after an early stop)."""
        return len(self.lrs)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready; a loss that was not finite is None)."""
        return {
            "suggestion": self.suggestion,
            "reason": self.reason,
            "stopped": self.stopped,
            "min_loss_lr": self.min_loss_lr,
            "steps": self.steps,
            "device": self.device,
            "precision": self.precision,
            "lrs": list(self.lrs),
            "losses": [_finite_or_none(v) for v in self.losses],
            "smoothed_losses": [_finite_or_none(v) for v in self.smoothed_losses],
            "config": self.config.to_dict(),
        }

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """Draw the curve into the PNG ``path``, the suggestion marked; return the path.
        Raises ``ImportError`` naming the fix without matplotlib (the ``plots`` extra)."""
        title = f"Learning-rate range test: {self.steps} steps ({self.stopped})"
        return write_lr_plot(
            Path(path),
            self.lrs,
            self.losses,
            self.smoothed_losses,
            suggestion=self.suggestion,
            lowest=self.min_loss_lr,
            title=title,
        )


def _finite_or_none(value: float) -> float | None:  # JSON has no NaN or infinity
    return value if math.isfinite(value) else None
