"""The GPU suite's plumbing: a dry run on CPU writes every case, the header, and no errors;
a failing or overrunning case becomes an "error: ..." row and the suite goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_suite
from benchmarks.gpu_suite_rows import Ctx, Row

ROOT = Path(__file__).resolve().parents[1]
HEADER = ("device", "driver", "torch", "cuda", "date")


def test_dry_run_writes_every_case_and_the_header(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
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
    cases = {row["case"] for row in data["rows"]}
    assert cases == set(gpu_suite.CASES)
    for case in gpu_suite.CASES:
        assert f"| {case} | " in markdown
    assert "error:" not in markdown
    statuses = {row["status"] for row in data["rows"]}
    assert statuses <= {"dry-run", "skipped"}, statuses  # goals are not judged in a dry run
    skipped = [row for row in data["rows"] if row["status"] == "skipped"]
    assert all(row["note"] for row in skipped)  # every skip says why
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


def test_unknown_case_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"unknown case.*'fast'.*choose from overhead"):
        gpu_suite.main(["--dry-run", "--only", "fast", "--out", str(tmp_path)])
