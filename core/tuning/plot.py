"""The range test's PNG: raw and smoothed loss against the learning rate (log scale), the
suggestion and the smoothed minimum marked. Drawn on matplotlib's Agg canvas directly
(never pyplot or the global backend, which belong to the application).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from core.tuning.suggest import reading_window

__all__ = ("PLOTS_MISSING", "write_lr_plot")

PLOTS_MISSING = (
    "the learning-rate plot needs matplotlib, which is not installed. Fix: "
    "pip install matplotlib, or pip install -e '.[plots]' in core's checkout (the curve "
    "itself is in to_dict())."
)


def write_lr_plot(
    path: Path,
    lrs: Sequence[float],
    losses: Sequence[float],
    smoothed: Sequence[float],
    *,
    suggestion: float | None,
    lowest: float,
    title: str,
) -> Path:
    """Draw the curve into ``path`` (PNG) and return it; ``ImportError`` without
    matplotlib, saying how to install it."""
    try:
        # The package first: a blocked matplotlib must fail here even when some of its
        # submodules were imported earlier.
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(PLOTS_MISSING) from exc
    figure = Figure(figsize=(8.0, 5.0), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)  # savefig renders with Agg, whatever the backend
    ax = figure.subplots()
    raw = [v if math.isfinite(v) else math.nan for v in losses]
    ax.plot(lrs, raw, color="0.75", linewidth=1, label="loss")
    ax.plot(lrs, smoothed, color="C0", linewidth=2, label="smoothed loss")
    if suggestion is not None:  # none from a sweep too short to read
        ax.axvline(suggestion, color="C3", linestyle="--", label=f"suggestion {suggestion:.2e}")
    ax.axvline(lowest, color="C2", linestyle=":", label=f"lowest {lowest:.2e}")
    ax.set_xscale("log")
    window = reading_window(smoothed)
    if window is not None:  # the part the suggestion is read from: the tail would flatten it
        skip, bottom, _finite = window
        low, top = smoothed[bottom], max(smoothed[skip : bottom + 1])
        pad = 0.3 * (top - low) or 0.1 * abs(low) or 1.0
        ax.set_ylim(low - pad, top + pad)
    ax.set_xlabel("learning rate (log scale)")
    ax.set_ylabel("training loss")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    figure.savefig(path, format="png")
    return path
