"""A run's reports, rebuilt from its ``events.jsonl`` alone: ``training_metrics.png`` (six
panels) and ``performance_summary.txt`` (throughput, step times, input stalls, AMP, memory,
validation, errors; experts for MoE runs), plus ``expert_activations.png`` and
``expert_device_distribution.png`` for mixture-of-experts runs. Works for any finished or
crashed run."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from core.reports.expert_plots import write_expert_activations, write_expert_device_distribution
    from core.reports.plots import write_training_plot
    from core.reports.read import Records, read_events
    from core.reports.summary import format_performance_summary

__all__ = (
    "ACTIVATIONS_FILE",
    "DEVICES_FILE",
    "PLOT_FILE",
    "REPORT_FILES",
    "SUMMARY_FILE",
    "format_performance_summary",
    "read_events",
    "write_expert_activations",
    "write_expert_device_distribution",
    "write_reports",
    "write_training_plot",
)

PLOT_FILE = "training_metrics.png"
SUMMARY_FILE = "performance_summary.txt"
ACTIVATIONS_FILE = "expert_activations.png"
DEVICES_FILE = "expert_device_distribution.png"
REPORT_FILES = (SUMMARY_FILE, PLOT_FILE, ACTIVATIONS_FILE, DEVICES_FILE)
"""Every file :func:`write_reports` may write, in the order it writes them."""

_log = structlog.get_logger("core")

# A training process imports this package to start its reports in a child process: the
# modules that read and draw them load in that child, or here when first used.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "format_performance_summary": "core.reports.summary",
        "read_events": "core.reports.read",
        "write_expert_activations": "core.reports.expert_plots",
        "write_expert_device_distribution": "core.reports.expert_plots",
        "write_training_plot": "core.reports.plots",
    },
)


def write_reports(run_dir: Path, *, events_file: str = "events.jsonl") -> list[Path]:
    """Write :data:`REPORT_FILES` that apply into ``run_dir`` from its ``events_file``; the
    files written (the summary always, the PNGs when matplotlib is installed and they apply).

    Odd record content never raises: a failing section or plot is logged (``report_failed``)
    and replaced by a note or left out. Raises ``FileNotFoundError`` when ``events_file`` is
    absent, ``OSError`` when it cannot be read or ``run_dir`` cannot be written.

    >>> [p.name for p in write_reports(Path("logs/demo/20261122-031500.123-a1b2c3"))]
    ['performance_summary.txt', 'training_metrics.png']
    """
    # Looked up on this package when called: loaded on first use, and a drawing function
    # replaced on the package (a test's stand-in) is the one that draws.
    from core.reports import (
        format_performance_summary,
        read_events,
        write_expert_activations,
        write_expert_device_distribution,
        write_training_plot,
    )

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
    partial = summary.with_name(f".{summary.name}.partial")
    partial.write_text(content, encoding="utf-8")
    os.replace(partial, summary)  # whole or absent, for a reader beside the writer
    written = [summary]
    _figure(write_training_plot, records, run_dir / PLOT_FILE, written)
    _figure(write_expert_activations, records, run_dir / ACTIVATIONS_FILE, written)
    _figure(write_expert_device_distribution, records, run_dir / DEVICES_FILE, written)
    return written


def _figure(
    draw: Callable[[Records, Path], Path | None], records: Records, path: Path, written: list[Path]
) -> None:
    """Draw one figure into ``path`` and append it to ``written``; a failure is logged."""
    # Drawn under a temporary name and renamed: a reader beside the writer never sees half a PNG.
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        if draw(records, partial) is not None:
            os.replace(partial, path)
            written.append(path)
    except Exception as exc:  # a report must never fail the run that asked for it
        _log.warning("report_failed", report=path.name, error=f"{type(exc).__name__}: {exc}")
        partial.unlink(missing_ok=True)
