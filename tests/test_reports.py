"""The reports rebuilt from events.jsonl: the PNG of a real fp16 run with overflows, the
summary's numbers against the records, crashed runs, odd records, matplotlib absent."""

from __future__ import annotations

import math
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import psutil
import pytest
import structlog
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from PIL import Image

from core import create_optimized_training_optimizer
from core.reports import (
    PLOT_FILE,
    SUMMARY_FILE,
    format_performance_summary,
    plots,
    read_events,
    write_reports,
    write_training_plot,
)
from core.reports.apart import (
    ERROR_FILE,
    NICENESS,
    ReportsFailed,
    start_reports,
    write_reports_apart,
)
from core.reports.fmt import percentile, seconds
from core.telemetry.records import RECORDS
from tests.helpers import eventually, loaders, make_model

ROOT = Path(__file__).resolve().parents[1]

SECTIONS = (
    "Run",
    "Throughput",
    "Step time",
    "Input pipeline",
    "Bottleneck verdicts",
    "AMP",
    "Compile",
    "Memory peaks",
    "Validation",
    "Errors and warnings",
    "Profile",
)

pytestmark = pytest.mark.plots  # these tests render the plot


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """events.jsonl of a real 3-epoch fp16 run whose loss scale starts far too high (2^24):
    the first steps overflow and back the scale off, later growth overflows again."""
    torch.set_num_threads(1)
    train, val = loaders(n=1024)
    optimizer = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=train,
        val_loader=val,
        max_epochs=3,
        log_dir=tmp_path_factory.mktemp("logs"),
        monitor_interval_s=0.02,
        amp_dtype="fp16",
        amp_init_scale=2.0**24,
        amp_growth_interval=5,
    )
    results = anyio.run(optimizer.train)
    return Path(results.run_dir) / "events.jsonl"


@pytest.fixture
def run_dir(events: Path, tmp_path: Path) -> Path:
    """A fresh directory holding only a copy of the run's events.jsonl."""
    shutil.copy(events, tmp_path / "events.jsonl")
    return tmp_path


def steps_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == "train_step"]


@pytest.mark.slow  # the module's training run (shared), then a PNG
def test_a_real_fp16_run_gets_a_full_png_and_summary(run_dir: Path) -> None:
    records = read_events(run_dir / "events.jsonl")
    overflows = [s["step"] for s in steps_of(records) if s["overflow"]]
    assert len(overflows) >= 5 and overflows[:3] == [1, 2, 3]  # the loss-scale data is real

    written = write_reports(run_dir)

    assert written == [run_dir / SUMMARY_FILE, run_dir / PLOT_FILE]
    with Image.open(run_dir / PLOT_FILE) as image:
        assert image.format == "PNG" and image.size == (1400, 1000)
        assert image.mode in ("RGB", "RGBA")
        pixels = np.asarray(image.convert("RGB"), dtype=np.float64)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 500  # lines, markers, text: not blank
    assert pixels.std() > 20.0


@pytest.mark.slow  # the module's training run (shared)
def test_the_summary_numbers_match_the_records(events: Path) -> None:
    records = read_events(events)
    text = format_performance_summary(records)

    for title in SECTIONS:
        assert f"== {title} ==" in text
    steps = steps_of(records)
    assert re.search(rf"optimizer steps\s+{len(steps)}\n", text)
    ends = [r for r in records if r["event"] == "epoch_end"]
    expected = sum(e["samples"] for e in ends) / sum(e["epoch_time_s"] for e in ends)
    overall = re.search(r"overall\s+([\d,.]+) samples/s", text)
    assert overall is not None
    assert float(overall.group(1).replace(",", "")) == pytest.approx(expected, abs=0.05)
    overflows = sum(s["overflow"] for s in steps)
    assert re.search(rf"overflow steps\s+{overflows} \(steps 1, 2, 3,", text)
    assert f"skipped steps           {sum(s['skipped'] for s in steps)} of {len(steps)}" in text
    assert "loss scale max          16,777,216 (2^24)" in text
    final = f"{steps[-1]['loss_scale']:,.0f}"
    assert re.search(rf"loss scale final\s+{final} \(2\^\d+\)", text)
    assert "status                  completed" in text
    assert "torch allocator peak    not measured on CPU" in text
    times = [s["step_time_s"] for s in steps]
    assert f"p50                   {seconds(percentile(times[1:], 50))}" in text


@pytest.mark.slow  # the module's training run (shared)
def test_the_loss_scale_panel_marks_each_overflow(events: Path) -> None:
    from matplotlib.figure import Figure

    from core.reports.panels import loss_scale_panel

    records = read_events(events)
    overflow_steps = [float(s["step"]) for s in steps_of(records) if s["overflow"]]
    ax = Figure().subplots()
    loss_scale_panel(ax, records)

    (crosses,) = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert list(crosses.get_xdata()) == overflow_steps
    assert crosses.get_color() == "red" and ax.get_yscale() == "log"
    assert f"overflow ({len(overflow_steps)} steps)" in ax.get_legend_handles_labels()[1]


@pytest.mark.slow  # the module's training run (shared), then a PNG
def test_a_child_process_writes_the_same_reports_without_torch(run_dir: Path) -> None:
    written = write_reports_apart(run_dir)
    assert [p.name for p in written] == ["performance_summary.txt", "training_metrics.png"]
    in_child = (run_dir / "performance_summary.txt").read_text()
    assert in_child == format_performance_summary(read_events(run_dir / "events.jsonl"))
    with Image.open(run_dir / "training_metrics.png") as image:
        assert image.size == (1400, 1000)


def test_a_failing_child_says_why(tmp_path: Path) -> None:
    with pytest.raises(ReportsFailed, match=r"(?s)writer of .* failed: .*FileNotFoundError"):
        write_reports_apart(tmp_path)  # no events.jsonl there
    assert "FileNotFoundError" in (tmp_path / ERROR_FILE).read_text()  # kept for the user


def test_reports_start_at_once_and_outlive_the_process_that_started_them(
    run_dir: Path, tmp_path: Path
) -> None:
    program = (
        "import sys; from pathlib import Path; from core.reports.apart import start_reports; "
        "print(start_reports(Path(sys.argv[1])).finished)"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    )
    assert done.stdout.split() == ["False"]  # returned while the writer was still drawing
    with Image.open(eventually(run_dir / PLOT_FILE, timeout_s=120)):
        pass  # written by the child after its parent was gone


def command_line(process: psutil.Process) -> str:
    """Its command line ("" for one that is gone, or a zombie another test left)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def test_the_writer_runs_below_a_training_process_even_in_a_session_of_its_own(
    run_dir: Path,
) -> None:
    """Its own session is its own scheduling group under Linux's autogroup, where a nice
    value alone only counts within the group: both are set, or the next training shares its
    cores with this figure."""
    job = start_reports(run_dir)
    (writer,) = (p for p in psutil.Process().children() if str(run_dir) in command_line(p))
    seen = [writer.nice()]
    while seen[-1] != NICENESS and writer.is_running() and writer.status() != "zombie":
        time.sleep(0.01)
        seen.append(writer.nice())
    group = Path(f"/proc/{writer.pid}/autogroup")
    grouped = group.read_text() if group.exists() else None
    job.wait(timeout_s=120)
    assert NICENESS == 19 and seen[-1] == 19, seen
    if grouped is not None:
        assert grouped.strip().endswith("nice 19"), grouped


def test_a_crashed_runs_truncated_log_still_reports(run_dir: Path) -> None:
    log = run_dir / "events.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if b'"validation"' in line) + 5
    log.write_bytes(b"".join(lines[:cut]) + lines[cut][: len(lines[cut]) // 2])  # torn write

    records = read_events(log)
    assert len(records) == cut and records[-1]["event"] != "run_end"
    assert write_reports(run_dir) == [run_dir / SUMMARY_FILE, run_dir / PLOT_FILE]
    text = (run_dir / SUMMARY_FILE).read_text()
    assert "unfinished: no run_end record" in text
    last_step = steps_of(records)[-1]["step"]
    assert re.search(rf"optimizer steps\s+{last_step}\n", text)
    assert "epochs completed        1 of 3" in text


@pytest.mark.slow  # the module's training run (shared)
def test_without_matplotlib_the_summary_is_written_and_one_warning_logged(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    monkeypatch.setattr(plots, "_warned_unavailable", threading.Event())
    with structlog.testing.capture_logs() as logs:
        first = write_reports(run_dir)
        second = write_reports(run_dir)

    assert first == second == [run_dir / SUMMARY_FILE]
    assert not (run_dir / PLOT_FILE).exists()
    assert "== Throughput ==" in (run_dir / SUMMARY_FILE).read_text()
    warnings = [e for e in logs if e["event"] == "plots_unavailable"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"
    assert (
        warnings[0]["fix"]
        == "pip install matplotlib, or pip install -e '.[plots]' in core's checkout"
    )


def test_a_missing_events_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_reports(tmp_path)


def test_odd_content_never_raises_and_each_panel_says_no_data(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_bytes(
        b"not json\n\xff\xfe\n[1, 2]\n{}\n"
        b'{"event": "run_start", "config": 5, "resolved": [1], "device": null}\n'
        b'{"event": "train_step", "step": "x", "loss": "nan", "lr": null, "overflow": 1}\n'
        b'{"event": "validation", "metrics": [1], "val_loss": "a", "epoch": null}\n'
        b'{"event": "gpu_sample", "device": null, "t_s": "q", "util_pct": NaN}\n'
        b'{"event": "epoch_end", "epoch_time_s": 0, "samples": 5, "bottleneck": 3}\n'
        b'{"event": "profile", "table": 7}\n{"event": "run_end", "elapsed_s": -1e999'
    )
    assert write_reports(tmp_path) == [tmp_path / SUMMARY_FILE, tmp_path / PLOT_FILE]
    text = (tmp_path / SUMMARY_FILE).read_text()
    assert all(f"== {title} ==" in text for title in SECTIONS)
    assert "not available" not in text  # no section broke


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.floats(), max_size=3),
)
_FIELDS = sorted(
    {name for record in RECORDS.values() for name in record.__annotations__}
    | {"metrics", "elapsed_s", "samples_per_s", "plan", "table", "trace"}
)
_RECORD = st.builds(
    lambda event, fields: {"event": event, **fields},
    st.sampled_from([*RECORDS, "profile", "validation_start"]),
    st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=8),
)


@pytest.mark.slow  # 60 generated examples
@settings(max_examples=60, deadline=None)
@given(st.lists(_RECORD, max_size=12))
def test_every_section_survives_arbitrary_field_values(records: list[dict[str, Any]]) -> None:
    text = format_performance_summary(records)
    assert "not available" not in text and text.endswith("\n")


def test_percentile_interpolates_like_numpy() -> None:
    values = [0.3, 1.0, 0.2, 5.0, 0.7, 0.9]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None


def test_the_plot_leaves_pyplot_and_the_global_backend_alone(tmp_path: Path) -> None:
    import matplotlib

    (tmp_path / "events.jsonl").write_text('{"event": "train_step", "step": 1, "loss": 0.5}\n')
    had_pyplot = "matplotlib.pyplot" in sys.modules
    backend = matplotlib.rcParams._get_backend_or_none()
    assert write_training_plot(read_events(tmp_path / "events.jsonl"), tmp_path / "p.png")
    assert matplotlib.rcParams._get_backend_or_none() == backend
    if not had_pyplot:
        assert "matplotlib.pyplot" not in sys.modules


def test_reading_skips_blank_and_broken_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "a"}\n\n{"event": "b"\n{"event": "c"}\n')
    assert [r["event"] for r in read_events(path)] == ["a", "c"]


# What each panel must draw, worked out here from the records (not with core.reports.read):
# the records of the panel's event whose x and y are finite numbers (bools are not), in
# order; the rest skipped. A line is compared as (label, x data, y data).
Line = tuple[str, list[float], list[float]]
_GIB = float(2**30)
_PANEL_FIELDS = (
    "step",
    "loss",
    "lr",
    "loss_scale",
    "overflow",
    "step_time_s",
    "data_time_s",
    "mem_allocated_bytes",
    "train_loss",
    "val_loss",
    "val_accuracy",
    "metrics",
    "device",
    "source",
    "t_s",
    "util_pct",
    "mem_used_bytes",
    "ts",
    "precision",
)
_PANEL_RECORD = st.builds(  # the records the panels read, their fields any value at all
    lambda event, fields: {"event": event, **fields},
    st.sampled_from(["train_step", "epoch_end", "validation", "gpu_sample", "run_start"]),
    st.dictionaries(st.sampled_from(_PANEL_FIELDS), _VALUES, max_size=8),
)


def finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def pairs(records: list[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    """(xs, ys) over the records where both fields are finite numbers."""
    kept = [
        (a, b)
        for a, b in ((finite(r.get(x)), finite(r.get(y))) for r in records)
        if a is not None and b is not None
    ]
    return [a for a, _ in kept], [b for _, b in kept]


def named(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == event]


def posix(record: dict[str, Any]) -> float | None:
    value = record.get("ts")
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def shown(value: object) -> str:
    return "?" if value is None or value == "" else str(value)


def lines(ax: Any) -> list[Line]:
    """The labelled lines of ``ax``, in drawing order (the epoch markers are unlabelled)."""
    return [
        (
            line.get_label(),
            [float(v) for v in line.get_xdata()],
            [float(v) for v in line.get_ydata()],
        )
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    ]


def epoch_marks(ax: Any) -> list[float]:
    return [
        float(line.get_xdata()[0]) for line in ax.get_lines() if line.get_label().startswith("_")
    ]


def expected_panels(records: list[dict[str, Any]]) -> list[tuple[str, list[Line], str]]:
    """The first five panels: each one's title, lines and "no data" reason ("": it has data)."""
    steps = named(records, "train_step")
    loss = [
        ("train loss (per step)", *pairs(steps, "step", "loss")),
        ("train loss (epoch mean)", *pairs(named(records, "epoch_end"), "step", "train_loss")),
        ("val loss", *pairs(named(records, "validation"), "step", "val_loss")),
    ]
    loss = [line for line in loss if line[1]]

    runs = named(records, "validation")
    metrics = [("val accuracy", *pairs(runs, "step", "val_accuracy"))]
    found = {str(k) for r in runs if isinstance(r.get("metrics"), dict) for k in r["metrics"]}
    for name in sorted(found):
        values = [
            {"step": r.get("step"), "value": r["metrics"].get(name)}
            for r in runs
            if isinstance(r.get("metrics"), dict)
        ]
        metrics.append((f"val {name}", *pairs(values, "step", "value")))
    metrics = [line for line in metrics if line[1]]

    lr = [("learning rate", *pairs(steps, "step", "lr"))]
    lr = [line for line in lr if line[1]]

    over = pairs([r for r in steps if r.get("overflow") is True], "step", "loss_scale")
    scale = [
        ("loss scale", *pairs(steps, "step", "loss_scale")),
        (f"overflow ({len(over[0])} steps)", *over),
    ]
    scale = [line for line in scale if line[1]]
    start = next(iter(named(records, "run_start")), {})

    times: list[Line] = []
    for field, label in (("step_time_s", "step time"), ("data_time_s", "data wait")):
        kept = [(x, y) for x, y in zip(*pairs(steps, "step", field), strict=True) if y > 0]
        xs, ys = [x for x, _ in kept], [y for _, y in kept]
        half = min(50, max(2, len(ys) // 40))  # a centred rolling median
        median = [statistics.median(ys[max(0, i - half) : i + half + 1]) for i in range(len(ys))]
        times += [(f"{label} (each step)", xs, ys), (f"{label} (rolling median)", xs, median)]
    times = [line for line in times if line[1]]

    return [
        ("Loss", loss, "" if loss else "no finite loss recorded"),
        (
            "Validation metrics",
            metrics,
            "" if metrics else "no validation metrics" if runs else "no validation ran",
        ),
        ("Learning rate", lr, "" if lr else "no train_step records"),
        (
            "Loss scale (fp16)",
            scale,
            "" if scale else f"no loss scaler (precision {shown(start.get('precision'))})",
        ),
        ("Step time", times, "" if times else "no train_step records"),
    ]


def expected_device(records: list[dict[str, Any]]) -> tuple[list[Line], list[Line]]:
    """The device panel's lines: utilisation (left axis) and memory GiB (right axis)."""
    samples = named(records, "gpu_sample")
    origin = min(pairs(samples, "t_s", "t_s")[0], default=0.0)
    util: list[Line] = []
    memory: list[Line] = []
    for device in sorted({shown(s.get("device")) for s in samples}):
        mine = [s for s in samples if shown(s.get("device")) == device]
        host = any(s.get("source") == "psutil" for s in mine)
        xs, ys = pairs(mine, "t_s", "util_pct")
        if xs:
            label = "host CPU % (100 per core)" if host else f"GPU {device} util %"
            util.append((label, [x - origin for x in xs], ys))
        xs, ys = pairs(mine, "t_s", "mem_used_bytes")
        if xs:
            label = "process RSS GiB" if host else f"GPU {device} memory GiB"
            memory.append((label, [x - origin for x in xs], [y / _GIB for y in ys]))
    zero = posix(next(iter(samples or named(records, "run_start")), {}))
    timed = [(posix(r), finite(r.get("mem_allocated_bytes"))) for r in named(records, "train_step")]
    kept = [
        (t - zero, used / _GIB)
        for t, used in timed
        if zero is not None and t is not None and used is not None
    ]
    if kept:
        memory.append(("torch allocated GiB (train_step)", *map(list, zip(*kept, strict=True))))
    return util, memory


@pytest.mark.slow  # the module's training run (shared), 8 generated examples, each drawn
# No shrinking: each example takes a render (about 0.5 s), a failure would shrink for minutes.
@settings(max_examples=8, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(
    odd=st.lists(st.one_of(_RECORD, _PANEL_RECORD), max_size=12),
    at=st.integers(0, 200),
    with_run=st.booleans(),
)
def test_every_panel_draws_the_finite_values_of_its_records_and_survives_the_rest(
    events: Path, odd: list[dict[str, Any]], at: int, with_run: bool
) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from core.reports import panels

    # The real fp16 run's records (losses, overflows, validations, host samples) with the odd
    # ones among them, or the odd ones alone.
    run = read_events(events) if with_run else []
    records = run[:at] + odd + run[at:]
    figure = Figure(figsize=(6, 4), dpi=40)
    canvas = FigureCanvasAgg(figure)
    draws = (
        panels.loss_panel,
        panels.metrics_panel,
        panels.lr_panel,
        panels.loss_scale_panel,
        panels.step_time_panel,
        panels.device_panel,
    )
    axes = list(figure.subplots(3, 2).flat)
    for ax, draw in zip(axes, draws, strict=True):
        draw(ax, records)

    marks = pairs(named(records, "epoch_end"), "step", "step")[0]
    for ax, (title, drawn, no_data) in zip(axes, expected_panels(records), strict=False):
        assert ax.get_title(loc="left") == title
        assert lines(ax) == drawn, title
        assert [t.get_text() for t in ax.texts] == ([f"no data: {no_data}"] if no_data else [])
        assert epoch_marks(ax) == ([] if title == "Validation metrics" else marks), title
    for ax in axes[3:5]:  # loss scale, step time
        assert ax.get_yscale() == ("log" if lines(ax) else "linear")
    device = axes[5]
    (memory_ax,) = (a for a in figure.axes[6:] if device.get_shared_x_axes().joined(device, a))
    util, memory = expected_device(records)
    assert device.get_title(loc="left") == "Device utilisation and memory"
    assert lines(device) == util and lines(memory_ax) == memory
    no_data = [] if util or memory else ["no data: no gpu_sample records (monitor off)"]
    assert [t.get_text() for t in device.texts] == no_data
    if with_run:  # the run's own numbers are among them (what we compared is not empty)
        steps = named(run, "train_step")
        assert {s["loss"] for s in steps} <= set(lines(axes[0])[0][2])
        assert {s["loss_scale"] for s in steps} <= set(lines(axes[3])[0][2])

    canvas.draw()  # rendering too, after the checks (most of the time goes here): log axes
    # and tick formatters run here
