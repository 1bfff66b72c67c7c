"""The GPU suite's plumbing: a dry run on CPU writes every case, the header, and no errors;
a failing or overrunning case becomes an "error: ..." row and the suite goes on; a finished
case's rows are on disk before the next case starts; every core run says ``compile=``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import distributed, gpu_suite, gpu_suite_overhead, gpu_suite_rows, overhead
from benchmarks import monitor as monitor_bench
from benchmarks.gpu_suite_rows import Ctx, Row
from benchmarks.peers import Peer, fabric_loop

ROOT = Path(__file__).resolve().parents[1]
HEADER = ("device", "driver", "torch", "cuda", "date")


@pytest.mark.processes
def test_dry_run_writes_every_case_and_the_header(tmp_path: Path) -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "benchmarks.gpu_suite", "--dry-run", "--out", str(tmp_path)]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    markdown = (tmp_path / "gpu_suite.md").read_text()
    data = json.loads((tmp_path / "gpu_suite.json").read_text())
    for field in HEADER:
        assert f"- {field}: " in markdown
        assert data[field]
    assert data["mode"] == "dry-run"
    assert data["state"] == "complete"
    cases = {row["case"] for row in data["rows"]}
    assert cases == set(gpu_suite.CASES)
    for case in gpu_suite.CASES:
        assert f"| {case} | " in markdown
    assert "error:" not in markdown
    statuses = {row["status"] for row in data["rows"]}
    assert statuses <= {"dry-run", "skipped"}, statuses  # goals are not judged in a dry run
    skipped = [row for row in data["rows"] if row["status"] == "skipped"]
    assert all(row["note"] for row in skipped)  # every skip says why
    figures = {row["figure"] for row in data["rows"]}
    for job in ("gpt2", "mlp"):  # measured or "not installed", never missing
        for who in ("core", "Fabric", "Accelerate"):
            assert f"{job}: {who} / hand-written" in figures
        assert f"{job}: steps with a host sync" in figures
    assert {"core: MFU = achieved / matmul", "hand step: MFU = achieved / matmul"} <= figures
    assert not (tmp_path / "results").exists()  # --out was honoured


def test_a_failing_or_overrunning_case_is_an_error_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(ctx: Ctx) -> list[Row]:
        raise ValueError("no such kernel")

    def endless(ctx: Ctx) -> list[Row]:
        while True:
            time.sleep(0.01)

    monkeypatch.setattr(gpu_suite, "DRY_RUN_BUDGET_S", 1)
    monkeypatch.setitem(gpu_suite.CASES, "broken", (broken, 1))
    monkeypatch.setitem(gpu_suite.CASES, "endless", (endless, 1))
    ctx = Ctx(torch.device("cpu"), True, tmp_path)
    rows, _ = gpu_suite.run_case("broken", ctx)
    assert [r.status for r in rows] == ["error: ValueError: no such kernel"]
    rows, _ = gpu_suite.run_case("endless", ctx)  # returns: the budget stopped it
    assert rows[0].status == "error: CaseTimeout: time budget of 1 s spent"


def test_a_finished_cases_rows_are_on_disk_before_the_next_case_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def first(ctx: Ctx) -> list[Row]:
        seen["header_first"] = json.loads((tmp_path / "gpu_suite.json").read_text())
        return [Row("first", "speed", "1.000", status="dry-run")]

    def second(ctx: Ctx) -> list[Row]:
        seen["json"] = json.loads((tmp_path / "gpu_suite.json").read_text())
        seen["md"] = (tmp_path / "gpu_suite.md").read_text()
        while True:  # then overruns its budget, as a real case might
            time.sleep(0.01)

    monkeypatch.setattr(gpu_suite, "DRY_RUN_BUDGET_S", 1)
    monkeypatch.setitem(gpu_suite.CASES, "first", (first, 1))
    monkeypatch.setitem(gpu_suite.CASES, "second", (second, 1))
    code = gpu_suite.main(["--dry-run", "--only", "first,second", "--out", str(tmp_path)])
    assert code == 1  # the overrun is an error row
    head = seen["header_first"]
    assert all(head[field] for field in HEADER) and head["rows"] == []  # header first
    assert head["state"] == "running first"
    assert [row["case"] for row in seen["json"]["rows"]] == ["first"]
    assert seen["json"]["state"] == "running second"
    assert "| first | speed | 1.000 |" in seen["md"]
    final = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert [row["case"] for row in final["rows"]] == ["first", "second"]
    assert final["rows"][1]["status"] == "error: CaseTimeout: time budget of 1 s spent"
    assert not list(tmp_path.glob(".*.partial"))  # files replaced whole, never half-written


def test_the_time_limit_skips_the_cases_that_no_longer_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budgets: list[float] = []

    def slow(ctx: Ctx) -> list[Row]:
        budgets.append(ctx.left())
        time.sleep(0.5)
        return [Row("slow", "x", "1", status="dry-run")]

    monkeypatch.setattr(gpu_suite, "MIN_CASE_S", 1)
    monkeypatch.setitem(gpu_suite.CASES, "slow", (slow, 60))
    monkeypatch.setitem(gpu_suite.CASES, "late", (slow, 60))
    argv = ["--dry-run", "--only", "slow,late", "--time-limit", "1.3", "--out", str(tmp_path)]
    assert gpu_suite.main(argv) == 0
    assert len(budgets) == 1 and budgets[0] <= 1.3  # the first case got the time left
    rows = json.loads((tmp_path / "gpu_suite.json").read_text())["rows"]
    assert rows[1]["case"] == "late" and rows[1]["status"] == "skipped"
    assert "--time-limit 1.3 s reached" in rows[1]["note"]


def test_rounds_stop_when_the_next_one_would_overrun_the_budget(tmp_path: Path) -> None:
    def run(seconds_left: float, want: int) -> list[int]:
        ctx = Ctx(torch.device("cpu"), False, tmp_path, deadline=time.monotonic() + seconds_left)
        done = []
        for number in gpu_suite_rows.rounds(ctx, want):
            done.append(number)
            time.sleep(0.05)
        return done

    assert run(1.0, 10) == [0]  # the first round always runs; a second would not fit
    assert run(30.0, 3) == [0, 1, 2]
    dry = Ctx(torch.device("cpu"), True, tmp_path)
    assert list(gpu_suite_rows.rounds(dry, 5)) == [0]


def test_torchrun_keeps_the_pythonpath_and_puts_the_repository_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/wheels/site", "/more"]))
    env = distributed.child_env(threads=0)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/wheels/site", "/more"]
    assert env["OMP_NUM_THREADS"] == "1"
    monkeypatch.delenv("PYTHONPATH")
    assert distributed.child_env(threads=2)["PYTHONPATH"] == str(ROOT)


def test_every_core_run_of_the_suite_passes_compile_explicitly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like for like: core's default may compile on CUDA; the suite must never rely on it."""
    calls: list[dict[str, Any]] = []
    for module in (overhead, gpu_suite_rows, monitor_bench):
        original = module.create_optimized_training_optimizer

        def spy(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, "create_optimized_training_optimizer", spy)
    absent = Peer("absent", "Absent", "no_such_package_for_the_suite", fabric_loop)
    monkeypatch.setattr(gpu_suite_overhead, "PEERS", {"absent": absent})  # "not installed"
    cases = "overhead_gpt2,overhead_mlp,sync_check,mfu_core,precision,monitor"
    argv = ["--dry-run", "--only", cases, "--out", str(tmp_path)]
    assert gpu_suite.main(argv) == 0
    assert len(calls) >= 10
    assert all(call.get("compile") is False for call in calls)  # CPU: mfu_core too
    rows = json.loads((tmp_path / "gpu_suite.json").read_text())["rows"]
    absent_rows = [row for row in rows if row["figure"].endswith(": Absent / hand-written")]
    assert len(absent_rows) == 2  # GPT-2 and the MLP
    assert all(row["status"] == "skipped" for row in absent_rows)
    assert all("not installed" in row["note"] for row in absent_rows)
    fastest = [row for row in rows if "core / fastest peer" in row["figure"]]
    assert {row["status"] for row in fastest} == {"skipped"}
