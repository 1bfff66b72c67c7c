"""Turns run records into what a tracker logs: hyper-parameters, text and scalar rows. Pure
functions over ``events.jsonl`` records; absent fields are skipped, so older runs convert too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from core.checks import is_finite_number, is_int
from core.reports.read import timestamp

__all__ = (
    "ParamValue",
    "Scalar",
    "flatten_params",
    "markdown_table",
    "model_summary_text",
    "scalars_of",
    "wall_time",
)

ParamValue = str | int | float | bool

# Scalar names by record type: record field -> tracker name (the optimizer step is x).
_SCALARS: dict[str, dict[str, str]] = {
    "train_step": {
        "loss": "train/loss",
        "accuracy": "train/accuracy",
        "lr": "train/lr",
        "grad_norm": "train/grad_norm",
        "loss_scale": "train/loss_scale",
        "samples_per_s": "train/samples_per_s",
        "step_time_s": "train/step_time_s",
    },
    "validation": {"val_loss": "val/loss", "val_accuracy": "val/accuracy"},
    "epoch_end": {
        "train_loss": "epoch/train_loss",
        "val_loss": "epoch/val_loss",
        "samples_per_s": "epoch/samples_per_s",
        "input_stall_fraction": "epoch/input_stall_fraction",
    },
}
_SUMMARY_COLUMNS = ("name", "class", "parameters", "trainable", "dtype", "size_mb")
_MAX_SUMMARY_ROWS = 200


class Scalar(NamedTuple):
    """One logged value: ``name`` at optimizer step ``step`` (the x value)."""

    name: str
    value: float
    step: int
    epoch: int | None
    wall_time: float  # seconds since the Unix epoch, from the record's ``ts``


def wall_time(record: Mapping[str, object]) -> float:
    """The record's ``ts`` as seconds since the Unix epoch (now when absent or unreadable)."""
    seconds = timestamp(record)
    return time.time() if seconds is None else seconds


def scalars_of(record: Mapping[str, object]) -> list[Scalar]:
    """The scalars of a ``train_step``, ``validation`` or ``epoch_end`` record (others: none).

    Fields that are absent, null or not finite are skipped; a ``validation`` record's
    ``metrics`` become ``val/<name>``, a ``train_step`` record's ``logged`` values (a
    ``training_step``'s) ``train/<name>``.

    >>> [s.name for s in scalars_of({"event": "validation", "step": 8, "val_loss": 0.7,
    ...                              "metrics": {"f1": 0.8, "auc": None}})]
    ['val/loss', 'val/f1']
    """
    names = _SCALARS.get(str(record.get("event")))
    step = record.get("step")
    if names is None or not is_int(step):
        return []
    epoch = record.get("epoch")
    epoch = epoch if is_int(epoch) else None
    fields = [(name, record.get(field)) for field, name in names.items()]
    metrics = record.get("metrics") if record.get("event") == "validation" else None
    if isinstance(metrics, Mapping):
        fields += [(f"val/{key}", value) for key, value in metrics.items()]
    logged = record.get("logged") if record.get("event") == "train_step" else None
    if isinstance(logged, Mapping):  # a training_step's own values
        fields += [(f"train/{key}", value) for key, value in logged.items()]
    when = wall_time(record)
    return [
        Scalar(name, float(value), step, epoch, when)
        for name, value in fields
        if is_finite_number(value)
    ]


def flatten_params(tree: Mapping[str, object], prefix: str = "") -> dict[str, ParamValue]:
    """A config tree as dotted keys to scalars: lists, None and other values become strings.

    >>> flatten_params({"run": {"max_epochs": 2, "seed": None}, "tags": ["a"]})
    {'run.max_epochs': 2, 'run.seed': 'None', 'tags': "['a']"}
    """
    params: dict[str, ParamValue] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            params.update(flatten_params(value, f"{name}."))
        elif isinstance(value, (str, int, float, bool)):
            params[name] = value
        else:
            params[name] = str(value)
    return params


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (TensorBoard's text tab renders it; plain text reads it).

    >>> markdown_table(("name", "value"), [("lr", 0.1)])
    '| name | value |\\n| --- | --- |\\n| lr | 0.1 |'
    """
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        cells = (str(cell).replace("|", "\\|").replace("\n", " ") for cell in row)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def model_summary_text(summary: object) -> str | None:
    """``run_start["model_summary"]`` as a Markdown table and a totals line (None: absent)."""
    if not isinstance(summary, Mapping):
        return None
    modules = summary.get("modules")
    modules = [m for m in modules if isinstance(m, Mapping)] if isinstance(modules, list) else []
    rows = [[module.get(column, "") for column in _SUMMARY_COLUMNS] for module in modules]
    lines = [markdown_table(_SUMMARY_COLUMNS, rows[:_MAX_SUMMARY_ROWS])] if rows else []
    if len(rows) > _MAX_SUMMARY_ROWS:
        lines.append(f"... and {len(rows) - _MAX_SUMMARY_ROWS} more modules")
    lines.append(
        f"Total: {summary.get('parameters', '?')} parameters, "
        f"{summary.get('trainable', '?')} trainable, {summary.get('size_mb', '?')} MB"
    )
    return "\n\n".join(lines)
