"""The six panels of ``training_metrics.png``, each drawn from the records onto one matplotlib
``Axes``; a panel without data keeps its frame and says "no data" and why."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from core.reports.read import Records, first, mapping, number, numbers, of, series, text, timestamp

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = (
    "device_panel",
    "loss_panel",
    "loss_scale_panel",
    "lr_panel",
    "metrics_panel",
    "no_data",
    "step_time_panel",
)

_MAX_POINTS = 4000  # raw points drawn per series; a longer run is thinned evenly
_UTIL_COLOURS = ("tab:blue", "tab:cyan", "tab:olive", "tab:gray")
_MEMORY_COLOURS = ("tab:brown", "tab:pink", "tab:purple", "black")
_GIB = float(2**30)


def _thin(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    stride = max(1, len(xs) // _MAX_POINTS)
    return list(xs[::stride]), list(ys[::stride])


def _rolling_median(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """A centred rolling median (about a twentieth of the points wide, 5 to 101), evaluated
    at no more than ``_MAX_POINTS`` // 4 positions."""
    n = len(ys)
    half = min(50, max(2, n // 40))
    stride = max(1, n // (_MAX_POINTS // 4))
    positions = range(0, n, stride)
    return [xs[i] for i in positions], [
        statistics.median(ys[max(0, i - half) : i + half + 1]) for i in positions
    ]


def no_data(ax: Axes, why: str) -> None:
    """A panel's frame saying "no data" and why, without tick labels."""
    ax.text(
        0.5,
        0.5,
        f"no data: {why}",
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=10,
        color="0.4",
    )
    ax.tick_params(labelleft=False, labelbottom=False, labelright=False)


def _epoch_lines(ax: Axes, records: Records) -> None:
    for step in numbers(of(records, "epoch_end"), "epoch_end", "step"):
        ax.axvline(step, color="0.85", linewidth=0.8, zorder=0)


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best", framealpha=0.8)


def loss_panel(ax: Axes, records: Records) -> None:
    """(a) Training loss per step, its epoch mean, and the validation loss."""
    steps, losses = _thin(*series(records, "train_step", "loss"))
    ends = series(records, "epoch_end", "train_loss")
    vals = series(records, "validation", "val_loss")
    if steps:
        ax.plot(
            steps,
            losses,
            linewidth=0.8,
            alpha=0.45,
            color="tab:blue",
            label="train loss (per step)",
        )
    if ends[0]:
        ax.plot(*ends, marker="o", markersize=4, color="tab:blue", label="train loss (epoch mean)")
    if vals[0]:
        ax.plot(*vals, marker="s", markersize=4, color="tab:orange", label="val loss")
    if not (steps or ends[0] or vals[0]):
        no_data(ax, "no finite loss recorded")
    _epoch_lines(ax, records)
    _finish(ax, "Loss", "optimizer step", "loss")


def metrics_panel(ax: Axes, records: Records) -> None:
    """(b) Validation accuracy and the user's metrics, per validation."""
    runs = of(records, "validation")
    accuracy = series(runs, "validation", "val_accuracy")
    if accuracy[0]:
        ax.plot(*accuracy, marker="o", markersize=4, label="val accuracy")
    names = sorted(
        {str(k) for r in runs if isinstance(r.get("metrics"), dict) for k in r["metrics"]}
    )
    for name in names:
        xs, ys = [], []
        for r in runs:
            x, y = number(r.get("step")), number(mapping(r, "metrics").get(name))
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
        if xs:
            ax.plot(xs, ys, marker="^", markersize=4, label=f"val {name}")
    if not ax.get_legend_handles_labels()[0]:
        no_data(ax, "no validation metrics" if runs else "no validation ran")
    _finish(ax, "Validation metrics", "optimizer step", "value")


def lr_panel(ax: Axes, records: Records) -> None:
    """(c) The learning rate of the first parameter group, per step."""
    from matplotlib.ticker import FuncFormatter

    steps, lrs = _thin(*series(records, "train_step", "lr"))
    if steps:
        ax.plot(steps, lrs, color="tab:green", linewidth=1.2, label="learning rate")
        # plain tick labels: an offset text ("1e-3") above the axis collides with the title
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    else:
        no_data(ax, "no train_step records")
    _epoch_lines(ax, records)
    _finish(ax, "Learning rate", "optimizer step", "learning rate")


def loss_scale_panel(ax: Axes, records: Records) -> None:
    """(d) The fp16 loss scale per step (log scale), overflow steps as red crosses."""
    steps = of(records, "train_step")
    xs, scales = series(steps, "train_step", "loss_scale")
    if xs:
        ax.plot(
            *_thin(xs, scales),
            drawstyle="steps-post",
            color="tab:purple",
            linewidth=1.2,
            label="loss scale",
        )
        over = [(x, y) for x, y, s in zip(xs, scales, _overflowed(steps), strict=False) if s]
        if over:
            ax.plot(
                [x for x, _ in over],
                [y for _, y in over],
                "x",
                color="red",
                markersize=7,
                label=f"overflow ({len(over)} steps)",
            )
        ax.set_yscale("log", base=2)
    else:
        precision = text((first(records, "run_start") or {}).get("precision"))
        no_data(ax, f"no loss scaler (precision {precision})")
    _epoch_lines(ax, records)
    _finish(ax, "Loss scale (fp16)", "optimizer step", "loss scale (log2)")


def _overflowed(steps: Records) -> list[bool]:
    """``overflow`` for the steps that have a finite step and loss scale (as ``series``)."""
    return [
        r.get("overflow") is True
        for r in steps
        if number(r.get("step")) is not None and number(r.get("loss_scale")) is not None
    ]


def step_time_panel(ax: Axes, records: Records) -> None:
    """(e) Step time and data-wait time per step: raw points and a rolling median."""
    drawn = False
    for field, label, colour in (
        ("step_time_s", "step time", "tab:blue"),
        ("data_time_s", "data wait", "tab:orange"),
    ):
        xs, ys = series(records, "train_step", field)
        kept = [(x, y) for x, y in zip(xs, ys, strict=True) if y > 0]  # log axis
        if not kept:
            continue
        xs, ys = [x for x, _ in kept], [y for _, y in kept]
        ax.plot(
            *_thin(xs, ys),
            ".",
            markersize=2.5,
            alpha=0.35,
            color=colour,
            label=f"{label} (each step)",
        )
        ax.plot(
            *_rolling_median(xs, ys), color=colour, linewidth=1.6, label=f"{label} (rolling median)"
        )
        drawn = True
    if drawn:
        ax.set_yscale("log")
    else:
        no_data(ax, "no train_step records")
    _epoch_lines(ax, records)
    _finish(ax, "Step time", "optimizer step", "seconds (log)")


def device_panel(ax: Axes, records: Records) -> None:
    """(f) Utilisation % (left axis) and memory GiB (right, the torch allocator too) against
    seconds since the first monitor sample."""
    memory_ax = ax.twinx()
    memory = _monitor_lines(ax, memory_ax, of(records, "gpu_sample"))
    times, allocated = _allocated(records)
    if times:
        memory_ax.plot(
            times,
            allocated,
            ":",
            linewidth=1.2,
            color="tab:red",
            label="torch allocated GiB (train_step)",
        )
        memory += allocated
    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = memory_ax.get_legend_handles_labels()
    if not handles + more_handles:
        no_data(ax, "no gpu_sample records (monitor off)")
        memory_ax.tick_params(labelright=False)
    _finish(ax, "Device utilisation and memory", "seconds since the first sample", "utilisation %")
    memory_ax.set_ylabel("memory GiB", fontsize=9)
    memory_ax.tick_params(labelsize=8)
    # Both axes from zero (a flat RSS reads flat), with the top quarter left to the legend.
    utilisation = [y for line in ax.get_lines() for y in _floats(line.get_ydata())]
    if utilisation:
        ax.set_ylim(0.0, max(utilisation) * 1.35 or 1.0)
    if memory:
        memory_ax.set_ylim(0.0, max(memory) * 1.35 or 1.0)
    if handles + more_handles:
        ax.legend(
            handles + more_handles,
            labels + more_labels,
            fontsize=8,
            loc="upper center",
            ncol=3,
            framealpha=0.8,
        )


def _floats(values: object) -> list[float]:
    """A line's data as floats (matplotlib types ``get_ydata`` loosely)."""
    if not isinstance(values, Iterable):
        return []
    return [v for v in (number(x) for x in values) if v is not None]


def _monitor_lines(ax: Axes, memory_ax: Axes, samples: Records) -> list[float]:
    """Draw each device's utilisation and memory; return the memory values drawn (GiB)."""
    origin = min(numbers(samples, "gpu_sample", "t_s"), default=0.0)
    devices = sorted({text(s.get("device")) for s in samples})
    marker = "." if len(samples) <= 50 * max(1, len(devices)) else None  # show sparse samples
    drawn: list[float] = []
    for i, device in enumerate(devices):
        mine = [s for s in samples if text(s.get("device")) == device]
        host = any(s.get("source") == "psutil" for s in mine)
        xs, util = _thin(*series(mine, "gpu_sample", "util_pct", x="t_s"))
        label = "host CPU % (100 per core)" if host else f"GPU {device} util %"
        if xs:
            ax.plot(
                [x - origin for x in xs],
                util,
                linewidth=1.2,
                marker=marker,
                label=label,
                color=_UTIL_COLOURS[i % len(_UTIL_COLOURS)],
            )
        xs, used = _thin(*series(mine, "gpu_sample", "mem_used_bytes", x="t_s"))
        label = "process RSS GiB" if host else f"GPU {device} memory GiB"
        if xs:
            gib = [u / _GIB for u in used]
            drawn += gib
            colour = _MEMORY_COLOURS[i % len(_MEMORY_COLOURS)]
            memory_ax.plot(
                [x - origin for x in xs],
                gib,
                "--",
                linewidth=1.2,
                marker=marker,
                label=label,
                color=colour,
            )
    return drawn


def _allocated(records: Records) -> tuple[list[float], list[float]]:
    """train_step ``mem_allocated_bytes`` (GiB) against seconds since the first monitor
    sample (its ``ts``; the run's start without samples)."""
    start = first(records, "gpu_sample") or first(records, "run_start") or {}
    origin = timestamp(start)
    times: list[float] = []
    allocated: list[float] = []
    for r in of(records, "train_step"):
        t, used = timestamp(r), number(r.get("mem_allocated_bytes"))
        if origin is not None and t is not None and used is not None:
            times.append(t - origin)
            allocated.append(used / _GIB)
    return _thin(times, allocated)
