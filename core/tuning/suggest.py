"""Reading a learning rate off a range test's smoothed loss curve.

The rule: **one tenth of the rate where the smoothed loss is lowest**, the first tenth of
the sweep left out when looking for that lowest point (fastai's ``lr_min / 10``). Why this
rule and not the steepest slope, with the measurements: docs/training.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from core.tuning.config import MIN_STEPS

__all__ = ("RAN_OUT", "WEAK_DROP", "reading_window", "suggest_learning_rate", "too_short")

WEAK_DROP = 0.05
"""A smoothed loss that fell less than this fraction from the sweep's start to its lowest
point makes a weak curve: the reason says so, and how to sharpen it."""


RAN_OUT = "the train loader ran out"
"""How a sweep that ran out of batches says so (its ``stopped``)."""


def too_short(steps: int, stopped: str, num_steps: int) -> str:
    """Why a sweep of fewer than ``MIN_STEPS`` steps makes no suggestion, and the fix."""
    fix = (
        "a loader that can be iterated again (a DataLoader is cycled) or yields at least "
        "num_steps batches"
        if stopped.startswith(RAN_OUT)
        else "lower min_lr (or raise diverge_factor): the loss ran away before a curve formed"
    )
    return (
        f"no suggestion: {stopped}, {steps} of {num_steps} steps, fewer than the {MIN_STEPS} "
        f"a suggestion is read from. Fix: {fix}"
    )


def suggest_learning_rate(
    lrs: Sequence[float], smoothed: Sequence[float], min_lr: float
) -> tuple[float, str, float]:
    """``(suggestion, reason, lowest)``: one tenth of ``lowest``, the rate where the smoothed
    loss bottomed, never below ``min_lr``; the reason says how it was read.

    >>> lrs = [10.0**e for e in range(-6, 1)]
    >>> suggest_learning_rate(lrs, [2.3, 2.3, 2.2, 1.6, 0.9, 1.4, 9.0], 1e-6)[0]
    0.001
    """
    window = reading_window(smoothed)
    if window is None:
        reason = (
            "no curve to read: the first step's loss was not finite, so the suggestion is "
            "min_lr. Fix: check the data and the loss, or lower min_lr"
        )
        return min_lr, reason, min_lr
    skip, bottom, finite = window
    lowest, start, low = lrs[bottom], smoothed[skip], smoothed[bottom]
    suggestion = max(lowest / 10.0, min_lr)
    reason = (
        f"one tenth of {lowest:.1e}, where the smoothed loss bottomed ({low:.4g}, from "
        f"{start:.4g}): a decade below the bottom the loss still falls fast, clear of "
        "divergence"
    )
    notes = []
    if suggestion > lowest / 10.0:
        notes.append("raised to min_lr: the loss was lowest near the sweep's start; lower min_lr")
    if bottom == finite - 1 and finite == len(lrs):
        notes.append("the loss was still falling at the last rate; raise max_lr to see more")
    drop = (start - low) / abs(start) if start else 0.0
    if drop < WEAK_DROP:
        notes.append(
            f"a weak curve: the smoothed loss fell only {100 * drop:.1f}%; more steps "
            "(num_steps) or larger batches sharpen it"
        )
    return suggestion, reason + "".join(f"; {note}" for note in notes), lowest


def reading_window(smoothed: Sequence[float]) -> tuple[int, int, int] | None:
    """``(skip, bottom, finite)``: the points left out at the start, the index of the lowest
    smoothed loss after them, and how many leading points are finite; None without any."""
    finite = next((i for i, v in enumerate(smoothed) if not math.isfinite(v)), len(smoothed))
    if finite == 0:
        return None
    # The bias-corrected average starts as the first raw loss alone: a lucky first batch
    # would look like the minimum.
    skip = min(max(1, finite // 10), finite - 1)
    bottom = min(range(skip, finite), key=lambda i: smoothed[i])
    return skip, bottom, finite
