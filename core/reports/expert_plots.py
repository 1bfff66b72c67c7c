"""The two expert figures of a mixture-of-experts run: ``expert_activations.png`` (each expert's
share of its layer's assignments over the steps, the balance loss and the dropped fraction) and
``expert_device_distribution.png`` (experts per device or rank)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from core.reports.expert_devices import device_figure
from core.reports.expert_summary import LAST_STEPS
from core.reports.experts import ExpertSteps, expert_steps
from core.reports.panels import no_data
from core.reports.plots import warn_unavailable
from core.reports.read import Records, run_id

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = (
    "MAX_COLUMNS",
    "MAX_LAYERS",
    "activations_figure",
    "write_expert_activations",
    "write_expert_device_distribution",
)

MAX_LAYERS = 6
"""Layers drawn in ``expert_activations.png`` (the first ones; the title says so)."""
MAX_COLUMNS = 240
"""Heatmap columns at most: more steps are summed in equal bins."""
_DPI = 100


def activations_figure(records: Records) -> Figure | None:
    """The expert activations figure, or None when no record has MoE routing statistics."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    routing = expert_steps(records)
    if routing is None:
        return None
    layers = routing.layers[:MAX_LAYERS]
    rows = len(layers)
    figure = Figure(figsize=(14.0, 2.0 * rows + 2.8), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(rows + 1, 2, width_ratios=(5, 1), height_ratios=(*[1.0] * rows, 1.3))
    for row, layer in enumerate(layers):
        _heatmap(figure, figure.add_subplot(grid[row, 0]), routing, layer)
        _last_shares(figure.add_subplot(grid[row, 1]), routing, layer)
    _balance(figure.add_subplot(grid[rows, :]), routing)
    shown = (
        f"  |  first {rows} of {len(routing.layers)} layers shown"
        if rows < len(routing.layers)
        else ""
    )
    figure.suptitle(
        f"Expert activations  |  run {run_id(records)}  |  {len(routing.layers)} MoE layers{shown}",
        fontsize=13,
    )
    return figure


def _heatmap(figure: Figure, ax: Axes, routing: ExpertSteps, layer: str) -> None:
    import numpy as np

    experts, steps = routing.experts(layer), len(routing.steps)
    ax.set_title(f"{layer}: share of kept assignments", fontsize=10, loc="left")
    if experts == 0:
        no_data(ax, "no expert counts recorded")
        return
    size = _bin_size(steps)
    columns = math.ceil(steps / size)
    rows = routing.counts[layer]
    if all(len(row) == experts for row in rows):  # the usual case, without a Python loop
        summed = np.add.reduceat(np.asarray(rows, dtype=float), range(0, steps, size)).T
    else:  # experts added during the run: earlier rows are shorter
        summed = np.zeros((experts, columns))
        for index, row in enumerate(rows):
            summed[: len(row), index // size] += row
    totals = summed.sum(axis=0)
    share = np.divide(summed, totals, out=np.full_like(summed, np.nan), where=totals > 0)
    low, high = routing.steps[0], routing.steps[-1]
    top = max(float(np.nanmax(share, initial=0.0)), 1.0 / max(experts, 1))
    image = ax.imshow(
        np.ma.masked_invalid(share),
        aspect="auto",
        origin="lower",
        interpolation="nearest",
        cmap="viridis",
        vmin=0.0,
        vmax=top,
        extent=(low - 0.5, high + 0.5, -0.5, experts - 0.5),
    )
    bar = figure.colorbar(image, ax=ax, pad=0.01, fraction=0.03)
    bar.set_label("share", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    binned = f" (bins of {size} steps)" if size > 1 else ""
    ax.set_xlabel(f"optimizer step{binned}", fontsize=8)
    ax.set_ylabel("expert", fontsize=8)
    _integer_ticks(ax)


def _bin_size(steps: int) -> int:
    """Steps per heatmap column (and per point of the balance panel)."""
    return max(1, math.ceil(steps / MAX_COLUMNS))


def _last_shares(ax: Axes, routing: ExpertSteps, layer: str) -> None:
    last = min(len(routing.steps), LAST_STEPS)
    totals = routing.totals(layer, last)
    whole = sum(totals) or 1.0
    experts = len(totals)
    ax.barh(range(experts), [t / whole for t in totals], color="tab:blue", height=0.8)
    if experts:
        ax.axvline(1.0 / experts, color="tab:red", linestyle="--", linewidth=1.0, label="balanced")
        ax.legend(fontsize=7, loc="lower right", framealpha=0.8)
    ax.set_ylim(-0.5, max(experts, 1) - 0.5)
    ax.set_title(f"last {last} steps", fontsize=10, loc="left")
    ax.set_xlabel("share", fontsize=8)
    _integer_ticks(ax)
    ax.grid(True, axis="x", alpha=0.3)


def _integer_ticks(ax: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    ax.tick_params(labelsize=7)


def _balance(ax: Axes, routing: ExpertSteps) -> None:
    size = _bin_size(len(routing.steps))
    aux: list[tuple[float, float]] = []
    lost: list[tuple[float, float]] = []
    for low in range(0, len(routing.steps), size):
        picks = range(low, min(low + size, len(routing.steps)))
        x = sum(routing.steps[i] for i in picks) / len(picks)
        losses = [a for i in picks if (a := routing.aux_loss[i]) is not None]
        if losses:
            aux.append((x, sum(losses) / len(losses)))
        known = [i for i in picks if routing.dropped[i] is not None]
        dropped = sum(routing.dropped[i] or 0.0 for i in known)
        total = dropped + sum(routing.kept(i) for i in known)
        if total > 0:
            lost.append((x, 100.0 * dropped / total))
    if aux:
        ax.plot(
            *zip(*aux, strict=True),
            color="tab:purple",
            linewidth=1.4,
            label="balance (aux) loss, layer mean",
        )
    ax.axhline(1.0, color="0.5", linestyle=":", linewidth=1.0, label="1.0 = balanced")
    ax.set_ylabel("aux loss", fontsize=9)
    dropped_ax = ax.twinx()
    if lost:
        dropped_ax.plot(
            *zip(*lost, strict=True),
            color="tab:red",
            linewidth=1.0,
            alpha=0.8,
            label="dropped % of assignments (all layers)",
        )
    dropped_ax.set_ylabel("dropped %", fontsize=9)
    dropped_ax.set_ylim(bottom=0.0)
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = dropped_ax.get_legend_handles_labels()
    ax.legend(
        handles + more,
        labels + more_labels,
        fontsize=8,
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=3,
        frameon=False,
    )
    binned = f" (means over bins of {size} steps)" if size > 1 else ""
    ax.set_title("Routing balance and capacity drops", fontsize=11, loc="left")
    ax.set_xlabel(f"optimizer step{binned}", fontsize=9)
    ax.grid(True, alpha=0.3)
    for each in (ax, dropped_ax):
        each.tick_params(labelsize=8)


def write_expert_activations(records: Records, path: Path) -> Path | None:
    """Save :func:`activations_figure` as PNG to ``path``; None without MoE records."""
    return _save(activations_figure, records, path)


def write_expert_device_distribution(records: Records, path: Path) -> Path | None:
    """Save :func:`device_figure` as PNG to ``path``; None when no expert strategy ran."""
    return _save(device_figure, records, path)


def _save(draw: Callable[[Records], Figure | None], records: Records, path: Path) -> Path | None:
    try:
        import matplotlib  # noqa: F401  (the package first, as core.reports.plots does)
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError as exc:
        warn_unavailable(exc)
        return None
    figure = draw(records)
    if figure is None:
        return None
    path = Path(path)
    figure.savefig(path, dpi=_DPI, format="png")
    return path
