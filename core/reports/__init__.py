"""A run's reports, rebuilt from its ``events.jsonl`` alone: ``training_metrics.png`` (six
panels) and ``performance_summary.txt`` (throughput, step times, input stalls, AMP, memory,
validation, errors). Works for any finished or crashed run.

Example::

    written = write_reports(Path("logs/demo/20261122-031500.123-a1b2c3"))
"""

from __future__ import annotations

from pathlib import Path

import structlog

from core.reports.plots import write_training_plot
from core.reports.read import read_events
from core.reports.summary import format_performance_summary, write_performance_summary

__all__ = (
    "PLOT_FILE",
    "SUMMARY_FILE",
    "format_performance_summary",
    "read_events",
    "write_performance_summary",
    "write_reports",
    "write_training_plot",
)

PLOT_FILE = "training_metrics.png"
SUMMARY_FILE = "performance_summary.txt"

_log = structlog.get_logger("core")


def write_reports(run_dir: Path, *, events_file: str = "events.jsonl") -> list[Path]:
    """Write ``performance_summary.txt`` and ``training_metrics.png`` into ``run_dir`` from
    its ``events_file``; return the files written (the summary always, the PNG when
    matplotlib is installed).

    Odd record content never raises: a section or plot that fails is logged
    (``report_failed``) and replaced by a note (summary) or left out (plot), so a report
    problem cannot fail a run. Raises ``FileNotFoundError`` when ``events_file`` is absent,
    and ``OSError`` when it cannot be read or ``run_dir`` cannot be written.

    >>> [p.name for p in write_reports(Path("logs/demo/20261122-031500.123-a1b2c3"))]
    ['performance_summary.txt', 'training_metrics.png']
    """
    run_dir = Path(run_dir)
    records = read_events(run_dir / events_file)
    summary = run_dir / SUMMARY_FILE
    try:
        content = format_performance_summary(records)
    except Exception as exc:  # a report must never fail the run that asked for it
        _log.warning("report_failed", report=SUMMARY_FILE, error=f"{type(exc).__name__}: {exc}")
        content = (
            f"Performance summary of {run_dir.name}: could not be built from {events_file} "
            f"({type(exc).__name__}: {exc}).\n"
        )
    summary.write_text(content, encoding="utf-8")
    written = [summary]
    plot = run_dir / PLOT_FILE
    try:
        if write_training_plot(records, plot) is not None:
            written.append(plot)
    except Exception as exc:  # likewise, and no half-written PNG is left behind
        _log.warning("report_failed", report=PLOT_FILE, error=f"{type(exc).__name__}: {exc}")
        plot.unlink(missing_ok=True)
    return written
