"""The model summary: parameters, trainable parameters, dtype and size of each top-level
child module, and totals (the ``model_summary`` of ``run_start``), as a dict and as a table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from core.checks import is_int, is_number
from core.console.units import format_count

__all__ = ("OWN_ROW", "format_model_summary", "summarize_model")

OWN_ROW = "(own)"
"""The row of the parameters and buffers registered on the root module itself."""

_MB = 2**20


def _numel(tensor: torch.Tensor) -> int:
    # A lazy module's parameters have no shape until the first forward: count them as 0.
    if is_lazy(tensor):
        return 0
    return tensor.numel()


def _dtype_name(params: list[nn.Parameter]) -> str | None:
    names = {str(p.dtype).removeprefix("torch.") for p in params}
    if not names:
        return None
    return names.pop() if len(names) == 1 else "mixed"


def _describe(
    name: str, cls: str, params: list[nn.Parameter], buffers: list[torch.Tensor]
) -> dict[str, Any]:
    size = sum(_numel(t) * t.element_size() for t in [*params, *buffers])
    return {
        "name": name,
        "class": cls,
        "parameters": sum(_numel(p) for p in params),
        "trainable": sum(_numel(p) for p in params if p.requires_grad),
        "dtype": _dtype_name(params),
        "size_mb": round(size / _MB, 3),
    }


def summarize_model(model: nn.Module) -> dict[str, Any]:
    """Rows for the top-level children of ``model``, a ``"(own)"`` row for what is registered
    on ``model`` itself, and totals that count shared parameters (tied embeddings) once.
    ``dtype`` is ``"mixed"`` when a row's parameters differ; ``size_mb`` counts parameters
    and buffers (MiB).

    Example::

        summarize_model(nn.Linear(4, 2))["modules"]
        # [{'name': '(own)', 'class': 'Linear', 'parameters': 10, 'trainable': 10, ...}]
    """
    modules: list[dict[str, Any]] = []
    own_params = list(model.parameters(recurse=False))
    own_buffers = list(model.buffers(recurse=False))
    if own_params or own_buffers:
        modules.append(_describe(OWN_ROW, type(model).__name__, own_params, own_buffers))
    for name, child in model.named_children():
        params, buffers = list(child.parameters()), list(child.buffers())
        modules.append(_describe(name, type(child).__name__, params, buffers))
    everything = list(model.parameters()), list(model.buffers())  # shared ones once
    total = _describe("total", type(model).__name__, *everything)
    return {
        "modules": modules,
        "parameters": total["parameters"],
        "trainable": total["trainable"],
        "size_mb": total["size_mb"],
    }


def _cell(value: object, kind: str) -> str:
    if kind == "count":
        return format_count(value) if is_int(value) else "?"
    if kind == "size":
        return f"{value:.3f}" if is_number(value) else "?"
    return "-" if value is None else str(value)


_COLUMNS = (  # heading, key, kind, right-aligned
    ("module", "name", "text", False),
    ("class", "class", "text", False),
    ("params", "parameters", "count", True),
    ("trainable", "trainable", "count", True),
    ("dtype", "dtype", "text", False),
    ("size MB", "size_mb", "size", True),
)


def format_model_summary(summary: Mapping[str, Any], *, max_rows: int = 20) -> str:
    """An aligned text table of :func:`summarize_model`'s dict (or a record's copy of it),
    at most ``max_rows`` module rows, then a total row; missing values show as ``?``.

    Example::

        format_model_summary(summarize_model(model)).splitlines()[-1]
        # 'total              178        178             0.001'
    """
    rows = summary.get("modules")
    modules = [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []
    cells = [[_cell(row.get(key), kind) for _, key, kind, _ in _COLUMNS] for row in modules]
    hidden = len(cells) - max_rows
    if hidden > 0:
        cells = [*cells[:max_rows], [f"... {hidden} more", "", "", "", "", ""]]
    total = ["total", "", *(_cell(summary.get(key), kind) for _, key, kind, _ in _COLUMNS[2:4])]
    cells.append([*total, "", _cell(summary.get("size_mb"), "size")])
    table = [[heading for heading, *_ in _COLUMNS], *cells]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    lines = []
    for line in table:
        parts = [
            text.rjust(width) if right else text.ljust(width)
            for text, width, (_, _, _, right) in zip(line, widths, _COLUMNS, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)
