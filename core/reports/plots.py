"""``training_metrics.png``: six panels of a run's records, drawn with matplotlib's Agg canvas
directly (never pyplot nor the global backend: an application may have its own). Without
matplotlib (the ``plots`` extra) no PNG is written and one ``plots_unavailable`` warning is
logged per process."""

from __future__ import annotations

import threading
from pathlib import Path

import structlog

from core.reports.read import Records, first, last, mapping, run_id, text

__all__ = ("FIGURE_DPI", "FIGURE_INCHES", "warn_unavailable", "write_training_plot")

FIGURE_INCHES = (14.0, 10.0)  # at FIGURE_DPI, 1400 x 1000 pixels
FIGURE_DPI = 100

_log = structlog.get_logger("core")
_warned_unavailable = threading.Event()  # once per process; tests swap in a fresh Event
_warn_lock = threading.Lock()


def write_training_plot(records: Records, path: Path) -> Path | None:
    """Draw the run's training plot into ``path`` (PNG) and return ``path``; None, with one
    ``plots_unavailable`` warning per process, when matplotlib is not installed."""
    try:
        # The package itself first: a blocked or broken matplotlib must fail here, even
        # when some of its submodules were imported earlier.
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        warn_unavailable(exc)
        return None
    from core.reports.panels import (
        device_panel,
        loss_panel,
        loss_scale_panel,
        lr_panel,
        metrics_panel,
        step_time_panel,
    )

    figure = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself: savefig renders with Agg, whatever the backend
    grid = figure.subplots(3, 2)
    panels = (
        (loss_panel, metrics_panel),
        (lr_panel, loss_scale_panel),
        (step_time_panel, device_panel),
    )
    for row, draws in zip(grid, panels, strict=True):
        for ax, draw in zip(row, draws, strict=True):
            draw(ax, records)
    figure.suptitle(_title(records), fontsize=13)
    path = Path(path)
    figure.savefig(path, dpi=FIGURE_DPI, format="png")
    return path


def _title(records: Records) -> str:
    start = first(records, "run_start") or {}
    end = last(records, "run_end")
    experiment = text(mapping(start, "config", "run").get("experiment_name"))
    status = text(end.get("status")) if end is not None else "unfinished"
    return (
        f"{experiment}  |  run {run_id(records)}  |  device {text(start.get('device'))}  |  "
        f"precision {text(start.get('precision'))}  |  {status}"
    )


def warn_unavailable(exc: ImportError) -> None:
    """Log ``plots_unavailable`` (with the fix), once per process."""
    with _warn_lock:
        if _warned_unavailable.is_set():
            return
        _warned_unavailable.set()
    _log.warning(
        "plots_unavailable",
        reason=f"{type(exc).__name__}: {exc}",
        fix="pip install matplotlib, or pip install -e '.[plots]' in core's checkout",
    )
