"""The README's quick-start programs run as written (in a fresh interpreter, in a temp dir)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import eventually, pythonpath

ROOT = Path(__file__).resolve().parent.parent


def blocks(start: str | None = None, end: str | None = None) -> list[str]:
    """The README's python blocks (between the headings ``start`` and ``end``)."""
    text = (ROOT / "README.md").read_text()
    if start is not None:
        text = text[text.index(start) : text.index(end) if end else None]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def quick_start_blocks() -> list[str]:
    return blocks("## Quick start", "## Train, reload, predict")


def run_program(program: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program], check=False, cwd=cwd, capture_output=True, text=True,
        timeout=180, env={"PYTHONPATH": pythonpath(), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
    )  # fmt: skip


def test_the_quick_start_has_both_faces() -> None:
    blocks = quick_start_blocks()
    assert len(blocks) == 2
    assert "async with OptimizedTrainingOptimizer(" in blocks[0]
    assert "create_optimized_training_optimizer(" in blocks[1]
    assert blocks[1].index("optimizer.events()") < blocks[1].index("optimizer.train()")


@pytest.mark.parametrize("index", [0, 1])
def test_a_quick_start_program_runs_as_written(index: int, tmp_path: Path) -> None:
    done = run_program(quick_start_blocks()[index], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = {p.parent for p in (tmp_path / "logs").glob("*/*/events.jsonl")}
    eventually(run_dir / "performance_summary.txt")  # the reports, written in the background
    if index == 0:
        assert "logs" in done.stdout and "step-" in done.stdout  # the best checkpoint
        assert "completed" in done.stderr  # the end summary


def test_the_memory_and_speed_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = blocks("## Memory and speed", "## Several GPUs")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    batch_size = int(done.stdout.split()[0])
    assert 32 <= batch_size < 4096  # the budget binds


def test_train_reload_predict_runs_as_written(tmp_path: Path) -> None:
    (program,) = blocks("## Train, reload, predict", "## What a run does")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    best = re.search(r"best val_top1 ([0-9.]+)", done.stdout)
    reloaded = re.search(r"test accuracy ([0-9.]+)", done.stdout)
    assert best and reloaded and float(reloaded[1]) > 0.7, done.stdout
    inspected = re.search(r"^(cpu|single_gpu) \[(.+)\] latest (\d+) best (\d+) (\d+) steps/epoch",
                          done.stdout, flags=re.M)  # fmt: skip
    assert inspected, done.stdout
    steps = [int(step) for step in inspected[2].split(", ")]
    assert steps[0] == int(inspected[3]) == 65 and int(inspected[4]) in steps
    assert int(inspected[5]) == 13


@pytest.mark.slow
def test_the_trackers_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = blocks("## Logging and trackers", "## Inside a service")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("metrics.csv", "training_metrics.png", "profile"):
        assert name in done.stdout
    assert (tmp_path / "logs" / "mlflow.db").exists() and list((tmp_path / "runs").rglob("*"))


def test_every_python_block_of_the_readme_is_run_by_a_test() -> None:
    tested = [
        *quick_start_blocks(),
        *blocks("## Memory and speed", "## Several GPUs"),
        *blocks("## Train, reload, predict", "## What a run does"),
        *blocks("## Logging and trackers", "## Inside a service"),
        *blocks("## Inside a service", "## Flagship"),
        *blocks("## Several GPUs", "## Mixture of experts"),
        *blocks("## Mixture of experts", "## Device monitoring"),
        *blocks("## The seed API", "## The examples"),
    ]
    assert sorted(tested) == sorted(blocks())


def test_the_seed_api_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = blocks("## The seed API", "## The examples")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    loss = re.search(r"loss ([0-9.]+), accuracy ([0-9.]+), skipped False", done.stdout)
    assert loss and float(loss[2]) > 0.6, done.stdout
    assert "fp16-ready: True" in done.stdout
    assert list((tmp_path / "logs").rglob("events.jsonl"))


def test_the_several_gpus_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = blocks("## Several GPUs", "## Mixture of experts")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_mixture_of_experts_example_runs_as_written(tmp_path: Path) -> None:
    (program,) = blocks("## Mixture of experts", "## Device monitoring")
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    tokens = re.search(r"\{'moe': \[(\d+), (\d+), (\d+), (\d+)\]\} (\d+) ([0-9.]+)", done.stdout)
    assert tokens, done.stdout
    kept, dropped = sum(int(tokens[i]) for i in range(1, 5)), int(tokens[5])
    assert kept + dropped == 64 * 2  # samples x top_k
    assert float(tokens[6]) >= 1.0


def test_the_service_example_trains_in_a_child_process_as_written(tmp_path: Path) -> None:
    (program,) = blocks("## Inside a service", "## Flagship")
    assert 'isolation="process"' in program and 'if __name__ == "__main__":' in program
    done = run_program(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["16", "True"]
    (final,) = (tmp_path / "logs").glob("*/*/final_weights/step-000000016-*")
    assert (final / "manifest.json").is_file()
