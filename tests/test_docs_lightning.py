"""docs/lightning.md ("Coming from Lightning"): each program runs as written and shows what
its section says."""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path

import pytest

from tests.doc_blocks import python_blocks, run_program

pytestmark = pytest.mark.processes  # each test runs a page's program in a fresh interpreter

PAGE = "docs/lightning.md"


def run(heading: str, cwd: Path) -> list[str]:
    (program,) = python_blocks(PAGE, heading)
    done = run_program(program, cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def events(cwd: Path, experiment: str) -> list[dict[str, object]]:
    (path,) = (cwd / "logs" / experiment).glob("*/events.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_step_function_example_runs_as_written(tmp_path: Path) -> None:
    lines = run("## Your own step", tmp_path)
    assert lines[0].startswith("step 12 {'ce': ") and "'kd': " in lines[0]
    assert lines[-1].startswith("best val_error_rate ")
    validations = [r for r in events(tmp_path, "distill") if r["event"] == "validation"]
    assert all(set(r["metrics"]) == {"error_rate"} for r in validations)  # type: ignore[arg-type]


def test_the_steering_callback_example_runs_as_written(tmp_path: Path) -> None:
    reason, stopped = run("## Callbacks that steer", tmp_path)[-2:]
    # 3200 samples are 100 steps of 32: steering each step, the stop lands at that step.
    assert reason == "requested: the budget of 3200 samples is spent at step 100"
    assert stopped == "stopped after 100 steps; checkpoint True"
    end = events(tmp_path, "budget")[-1]
    assert (end["status"], end["stop_reason"]) == ("stopped", reason)


@pytest.mark.distributed
@pytest.mark.slow
def test_the_steering_callback_example_counts_every_ranks_samples(tmp_path: Path) -> None:
    (program,) = python_blocks(PAGE, "## Callbacks that steer")
    done = run_program(program.replace("progress=False,", "progress=False, devices=2,"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    reason, stopped = done.stdout.splitlines()[-2:]
    # Two ranks of 32 samples a step spend 3200 in 50 steps (counting rank 0's alone: 100);
    # the stop lands once the record of step 50 reached the callback and the ranks voted.
    assert reason == "requested: the budget of 3200 samples is spent at step 50"
    assert int(stopped.split()[2]) >= 50 and stopped.endswith("checkpoint True")


def test_the_early_stopping_and_plateau_example_runs_as_written(tmp_path: Path) -> None:
    rates, ended = run("## Early stopping and plateau schedules", tmp_path)[-2:]
    learning_rates = ast.literal_eval(rates.removeprefix("learning rates: "))
    assert learning_rates[0] == 0.01 and len(learning_rates) >= 2
    assert all(b == a / 2 for a, b in itertools.pairwise(learning_rates))
    epochs = int(ended.split()[0])
    assert 6 <= epochs < 40 and "early_stopping: val_loss did not improve" in ended
