"""The settings of a learning-rate range test, validated when created."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from core.checks import check_max_grad_norm, is_finite_number, is_int
from core.errors import config_error

__all__ = ("LRFinderConfig", "MIN_STEPS")

MIN_STEPS = 10
"""The fewest steps a range test may take: fewer points make no curve to read."""


@dataclass(frozen=True, kw_only=True)
class LRFinderConfig:
    """How the learning rate sweeps and when the sweep stops.

    ``num_steps`` optimizer steps run with learning rates spaced evenly in log space from
    ``min_lr`` to ``max_lr``. The loss is smoothed by an exponential moving average
    (``smoothing`` is its beta, bias-corrected as in Adam); the sweep stops once the
    smoothed loss passes ``diverge_factor`` times its lowest value (None: never) or a loss
    is not finite. ``max_grad_norm`` clips gradients as the run would (None: no clipping).
    """

    min_lr: float = 1e-7
    max_lr: float = 1.0
    num_steps: int = 100
    smoothing: float = 0.98
    diverge_factor: float | None = 4.0
    max_grad_norm: float | None = None

    def __post_init__(self) -> None:
        for name in ("min_lr", "max_lr"):
            value = getattr(self, name)
            if not (is_finite_number(value) and value > 0):
                raise config_error(name, value, "a finite float > 0", f"e.g. {name}=1e-3.")
        if self.min_lr >= self.max_lr:
            raise config_error(
                "min_lr",
                self.min_lr,
                f"a float below max_lr={self.max_lr!r}",
                "the sweep rises from min_lr to max_lr: pass e.g. min_lr=1e-7, max_lr=1.0.",
            )
        if not (is_int(self.num_steps) and self.num_steps >= MIN_STEPS):
            raise config_error(
                "num_steps",
                self.num_steps,
                f"an integer >= {MIN_STEPS}",
                "100 steps draw a curve worth reading (the default).",
            )
        if not (is_finite_number(self.smoothing) and 0.0 <= self.smoothing < 1.0):
            raise config_error(
                "smoothing", self.smoothing, "a float in [0, 1) (0: no smoothing)", "try 0.98."
            )
        factor = self.diverge_factor
        if factor is not None and not (is_finite_number(factor) and factor > 1.0):
            raise config_error(
                "diverge_factor",
                factor,
                "None (never stop early) or a finite float > 1",
                "try 4.0.",
            )
        check_max_grad_norm(self.max_grad_norm)

    def learning_rate(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based): ``min_lr`` first, ``max_lr`` last."""
        ratio = step / (self.num_steps - 1)
        exponent = math.log10(self.min_lr) + ratio * math.log10(self.max_lr / self.min_lr)
        return float(f"{10**exponent:.12g}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
