"""The figure of ``expert_device_distribution.png``: how many experts of each MoE layer each
device (one process: the placement plan, with its summed cost per SM) or each rank (torchrun)
held. Drawn on matplotlib's Agg canvas, never pyplot."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from core.reports.experts import ExpertPlacement, expert_placement, index_ranges
from core.reports.read import Records, run_id

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ("device_figure",)

_DPI = 100
_WIDTH = 0.6
_MAX_LABELLED = 16  # bars whose segments are labelled with expert indices, at most
_MAX_LEGEND = 12  # layers named in the legend, at most
_MAX_SEGMENT_TEXT = 9  # characters of a segment's label ("12-15"; longer ones are left out)


def device_figure(records: Records) -> Figure | None:
    """The expert placement figure, or None when no expert strategy ran."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    placement = expert_placement(records)
    if placement is None:
        return None
    planned = placement.kind == "planned"
    figure = Figure(figsize=(12.0, 5.5), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2 if planned else 1, squeeze=False)[0]
    _stacked(axes[0], placement)
    n = len(placement.holders)
    if planned:
        _costs(axes[1], placement)
        what = f"planned over {_plural(n, 'device')}  |  {placement.note}"
    else:
        what = f"{_plural(n, 'rank')}  |  {placement.note}"
    figure.suptitle(f"Experts across devices  |  run {run_id(records)}  |  {what}", fontsize=12)
    return figure


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _bar_axis(ax: Axes, placement: ExpertPlacement) -> None:
    """One tick per device or rank; a few bars keep a bar's width, not the whole axis."""
    holders = placement.holders
    n = len(holders)
    labels = [
        "\n".join(
            part
            for part in (
                h.label,
                textwrap.fill(h.name, 12),
                f"{h.sm_count:,.0f} SMs" if h.sm_count is not None else "",
            )
            if part
        )
        for h in holders
    ]
    ax.set_xticks(range(n), labels, fontsize=8 if n <= 8 else 6, rotation=0 if n <= 8 else 90)
    pad = max(0.0, (3 - n) / 2)
    ax.set_xlim(-0.5 - pad, n - 0.5 + pad)
    ax.grid(True, axis="y", alpha=0.3)


def _stacked(ax: Axes, placement: ExpertPlacement) -> None:
    holders = placement.holders
    layers = list(dict.fromkeys(layer for h in holders for layer in h.experts))
    x = list(range(len(holders)))
    bottom = [0.0] * len(holders)
    tallest = max((float(h.count) for h in holders), default=0.0)
    labelled = len(holders) <= _MAX_LABELLED
    for i, layer in enumerate(layers):
        heights = [float(len(h.experts.get(layer, []))) for h in holders]
        bars = ax.bar(
            x,
            heights,
            _WIDTH,
            bottom=bottom,
            color=f"C{i % 10}",
            edgecolor="white",
            label=layer if len(layers) <= _MAX_LEGEND else None,
        )
        if labelled:
            ax.bar_label(
                bars,
                labels=[
                    _segment(h.experts.get(layer, []), height, tallest)
                    for h, height in zip(holders, heights, strict=True)
                ],
                label_type="center",
                fontsize=8,
                color="white",
            )
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    _bar_axis(ax, placement)
    ax.set_ylabel("experts held", fontsize=9)
    segments = " (segments: expert indices)" if labelled else ""
    holder = "rank" if placement.kind == "ranks" else "device"
    ax.set_title(f"Experts per {holder}, by layer{segments}", fontsize=11, loc="left")
    if len(layers) > _MAX_LEGEND:
        ax.text(
            0.99,
            0.98,
            f"{len(layers)} layers",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
        )
    elif layers:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), framealpha=0.8)
    ax.set_ylim(0.0, tallest * 1.1 or 1.0)


def _segment(indices: list[str], height: float, tallest: float) -> str:
    """A segment's label: its expert indices, when short and the segment tall enough."""
    text = index_ranges(indices)
    return text if len(text) <= _MAX_SEGMENT_TEXT and height >= 0.04 * tallest else ""


def _per_sm(value: float) -> str:
    return f"{value:,.0f} / SM" if abs(value) >= 100 else f"{value:.3g} / SM"


def _costs(ax: Axes, placement: ExpertPlacement) -> None:
    from matplotlib.ticker import EngFormatter

    holders = placement.holders
    costs = [h.cost or 0.0 for h in holders]
    bars = ax.bar(range(len(holders)), costs, _WIDTH, color="tab:gray")
    if len(holders) <= _MAX_LABELLED:
        ax.bar_label(
            bars,
            labels=[
                _per_sm(c / h.sm_count) if h.sm_count else ""
                for c, h in zip(costs, holders, strict=True)
            ],
            fontsize=8,
        )
    _bar_axis(ax, placement)
    ax.yaxis.set_major_formatter(EngFormatter(sep=" "))  # no offset text over the title
    ax.set_ylabel("parameters x expected token share", fontsize=9)
    ax.set_title("Planned cost per device (label: per SM)", fontsize=11, loc="left")
    ax.set_ylim(0.0, max(costs, default=0.0) * 1.15 or 1.0)
