"""The end-of-run summary: how the run ended, its best and final numbers, its speed and
wall time, and where its checkpoints, logs and reports are, from ``run_end`` and a
:class:`~core.console.digest.RunDigest` of the records before it.
"""

from __future__ import annotations

import math
from pathlib import Path

from core.callbacks import Record
from core.checks import is_int, is_number
from core.console.banner import format_fields
from core.console.digest import RunDigest, lookup
from core.console.units import format_count, format_duration, format_number, format_percent
from core.reports import PLOT_FILE, SUMMARY_FILE
from core.reports.read import timestamp

__all__ = ("format_metrics", "format_summary")


def format_metrics(record: Record | None, *, prefix: str = "") -> list[str]:
    """``name value`` texts of the losses and metrics an ``epoch_end`` or ``validation``
    record holds (accuracy as a percentage); absent ones are left out.

    >>> format_metrics({"train_loss": 0.72741, "val_accuracy": 0.4375, "val_metrics": {"f1": 0.8}})
    ['train_loss 0.7274', 'val_accuracy 43.75%', 'f1 0.8']
    """
    if record is None:
        return []
    texts = [
        f"{prefix}{key} {format_number(record[key])}"
        for key in ("train_loss", "val_loss")
        if key in record
    ]
    if "val_accuracy" in record and record["val_accuracy"] is not None:
        texts.append(f"{prefix}val_accuracy {format_percent(record['val_accuracy'])}")
    metrics = record.get("val_metrics", record.get("metrics"))
    if isinstance(metrics, dict):
        texts.extend(f"{prefix}{name} {format_number(value)}" for name, value in metrics.items())
    return texts


def _progress(run_end: Record, digest: RunDigest) -> str | None:
    epochs, steps = run_end.get("epochs_completed"), run_end.get("global_step")
    planned = lookup(digest.run_start, "plan", "max_epochs")
    if not is_int(planned):
        planned = lookup(digest.run_start, "config", "run", "max_epochs")
    parts = []
    if is_int(epochs):
        parts.append(f"{epochs}/{planned} epochs" if is_int(planned) else f"{epochs} epochs")
    if is_int(steps):
        parts.append(f"{steps} steps")
    return ", ".join(parts) or None


def _best(run_end: Record, digest: RunDigest) -> str | None:
    monitor, value = run_end.get("monitor"), run_end.get("best_value")
    if not (monitor and is_number(value)):  # older runs: early stopping's lowest loss
        monitor, value = "loss", run_end.get("best_metric")
    if not is_number(value):
        return None
    where = run_end.get("best_checkpoint") or digest.best_checkpoint
    return f"{monitor} {format_number(value)}" + (f" (checkpoint {where})" if where else "")


def _speed(run_end: Record, digest: RunDigest) -> str | None:
    rate = run_end.get("samples_per_s")
    if not (is_number(rate) and math.isfinite(rate)) and digest.train_time_s > 0:
        rate = digest.train_samples / digest.train_time_s
    return f"{format_count(rate)} samples/s" if is_number(rate) else None


def _run_dir(run_end: Record, digest: RunDigest) -> Path | None:
    # run_end's null: a fast_dev_run's directory, removed (older records lack the field)
    run_dir = run_end["run_dir"] if "run_dir" in run_end else lookup(digest.run_start, "run_dir")
    return Path(run_dir) if isinstance(run_dir, str) and run_dir else None


def _failure(run_end: Record) -> str | None:
    error, kind = run_end.get("error"), run_end.get("error_type")
    if not (error or kind):
        return None
    return f"{kind}: {error}" if kind and error else str(error or kind)


def format_summary(run_end: Record, digest: RunDigest | None = None) -> str:
    """The lines shown when a run ends; what neither ``run_end`` nor the digest knows is
    left out (records of older runs lack the best value, wall time and speed).

    Example::

        format_summary({"event": "run_end", "status": "completed", "global_step": 16})
        # 'status    completed\\nprogress  16 steps'
    """
    digest = digest or RunDigest()
    status = run_end.get("status") or "unknown"
    wall = run_end.get("elapsed_s")
    if not is_number(wall):
        start, end = timestamp(digest.run_start or {}), timestamp(run_end)
        wall = end - start if start is not None and end is not None else None
    final = format_metrics(digest.last_epoch_end)
    if digest.last_epoch_end is None:  # a run stopped before its first epoch ended
        final = format_metrics(digest.last_validation)
    run_dir = _run_dir(run_end, digest)
    last = run_end.get("last_checkpoint", digest.last_checkpoint)
    fields: list[tuple[str, str | None]] = [
        ("status", str(status)),
        ("error", _failure(run_end)),
        ("progress", _progress(run_end, digest)),
        ("best", _best(run_end, digest)),
        ("final", ", ".join(final) or None),
        ("throughput", _speed(run_end, digest)),
        ("wall time", format_duration(wall) if is_number(wall) else None),
        ("last checkpoint", last if last or status == "completed" else "none was saved"),
        ("logs", str(run_dir / "events.jsonl") if run_dir else None),
    ]
    if run_dir and lookup(digest.run_start, "config", "logging", "reports") is True:
        reports = ", ".join(str(run_dir / name) for name in (PLOT_FILE, SUMMARY_FILE))
        fields.append(("reports", reports))
    if digest.warnings or digest.errors:
        counts = f"{digest.warnings} warnings, {digest.errors} errors during the run"
        fields.append(("alerts", counts + (" (see logs)" if run_dir else "")))
    return format_fields([(label, value) for label, value in fields if value])
