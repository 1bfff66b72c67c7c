"""StepProfiler: a window of steps profiled from a worker thread, written once, then off."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from core.errors import ConfigError
from core.telemetry.profiler import StepProfiler, check_profile_steps
from tests.helpers import make_model

Record = tuple[str, dict[str, Any]]


def train_on_a_worker_thread(
    profiler: StepProfiler, run_dir: Path, steps: int, first_step: int = 1
) -> list[int]:
    """A tiny training loop on a thread of its own, calling the hook as the step thread
    does; returns the steps at which the profiler was still running after the hook."""
    running: list[int] = []

    def loop() -> None:
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        profiler.start(run_dir)
        for step in range(first_step, first_step + steps):
            loss = model(torch.randn(16, 8)).logsumexp(dim=1).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler(step)
            if profiler.running:
                running.append(step)
        profiler.close()

    worker = threading.Thread(target=loop)
    worker.start()
    worker.join()
    return running


def test_the_window_is_traced_from_a_worker_thread_and_reported_once(tmp_path: Path) -> None:
    records: list[Record] = []
    profiler = StepProfiler(2, 1, 3, emit=lambda event, **fields: records.append((event, fields)))
    running = train_on_a_worker_thread(profiler, tmp_path, steps=10, first_step=41)
    assert running == [41, 42, 43, 44, 45]  # off once the window (steps 44-46) is written
    ((event, fields),) = records
    trace, table_file = tmp_path / "profile" / "trace.json", tmp_path / "profile" / "top_ops.txt"
    assert event == "profile"
    assert fields == {
        "trace": str(trace),
        "table_file": str(table_file),
        "first_step": 44,
        "last_step": 46,
        "table": fields["table"],
    }
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert {"aten::addmm", "aten::linear"} & names  # the forward's ops, seen on the worker
    markers = sorted(n for n in names if n.startswith("ProfilerStep#"))
    assert len(markers) == 3  # the active steps only: neither wait nor warmup
    table = table_file.read_text()
    assert table.strip() == fields["table"].strip()
    assert "aten::" in table and "Self CPU" in table
    assert len([line for line in table.splitlines() if "aten::" in line]) <= 20
    profiler.close()  # idempotent
    assert len(records) == 1


def test_a_run_ending_inside_the_window_writes_what_it_recorded(tmp_path: Path) -> None:
    records: list[Record] = []
    profiler = StepProfiler(0, 1, 5, emit=lambda event, **fields: records.append((event, fields)))
    train_on_a_worker_thread(profiler, tmp_path, steps=3)
    ((_, fields),) = records
    assert (fields["first_step"], fields["last_step"]) == (2, 3)
    assert json.loads(Path(fields["trace"]).read_text())["traceEvents"]


def test_a_run_ending_before_the_window_writes_nothing(tmp_path: Path) -> None:
    records: list[Record] = []
    profiler = StepProfiler(5, 1, 1, emit=lambda event, **fields: records.append((event, fields)))
    train_on_a_worker_thread(profiler, tmp_path, steps=3)
    assert records == [] and not (tmp_path / "profile").exists()
    assert not profiler.running


def test_close_from_another_thread_leaves_the_profiler_alone(tmp_path: Path) -> None:
    records: list[Record] = []
    profiler = StepProfiler(0, 1, 5, emit=lambda event, **fields: records.append((event, fields)))
    started = threading.Event()
    release = threading.Event()

    def loop() -> None:
        profiler.start(tmp_path)
        profiler(1)
        started.set()
        release.wait(timeout=30)
        profiler(2)  # the step thread goes on: stops it here, writing nothing

    worker = threading.Thread(target=loop)
    worker.start()
    started.wait(timeout=30)
    profiler.close()  # on the main thread: must neither crash nor write
    assert not profiler.running
    release.set()
    worker.join()
    assert records == [] and not (tmp_path / "profile").exists()
    again = StepProfiler(0, 1, 1, emit=lambda event, **fields: records.append((event, fields)))
    train_on_a_worker_thread(again, tmp_path, steps=3)  # the next profiler works
    assert [fields["first_step"] for _, fields in records] == [2]


@pytest.mark.parametrize(
    "bad", [(1, 1), (1, 1, 0), (-1, 1, 3), (1, 1, 3, 4), (True, 1, 3), (1.0, 1, 3), "1,1,3", 3]
)
def test_bad_profile_steps_are_config_errors(bad: object) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^profile_steps=.* is invalid; allowed: None \(off\) or a tuple of three "
        r"integers \(wait >= 0, warmup >= 0, active >= 1\)\. Fix: profile_steps=\(1, 1, 3\)",
    ):
        check_profile_steps(bad)


def test_good_profile_steps() -> None:
    assert check_profile_steps(None) is None
    assert check_profile_steps((0, 0, 1)) == (0, 0, 1)
    assert check_profile_steps([2, 1, 3]) == (2, 1, 3)
