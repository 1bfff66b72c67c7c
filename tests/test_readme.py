"""The README's quick-start programs run as written (in a fresh interpreter, in a temp dir)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def quick_start_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start") : text.index("## What a run does")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_quick_start_has_both_faces() -> None:
    blocks = quick_start_blocks()
    assert len(blocks) == 2
    assert "async with OptimizedTrainingOptimizer(" in blocks[0]
    assert "create_optimized_training_optimizer(" in blocks[1]


@pytest.mark.parametrize("index", [0, 1])
def test_a_quick_start_program_runs_as_written(index: int, tmp_path: Path) -> None:
    program = quick_start_blocks()[index]
    done = subprocess.run(
        [sys.executable, "-c", program], check=False, cwd=tmp_path, capture_output=True,
        text=True,
        timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert list((tmp_path / "logs").glob("*/*/events.jsonl"))  # the run wrote its log


def test_the_memory_and_speed_example_runs_as_written(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Memory and speed") : text.index("## Several GPUs")]
    (program,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    done = subprocess.run(
        [sys.executable, "-c", program], check=False, cwd=tmp_path, capture_output=True,
        text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    batch_size = int(done.stdout.split()[0])
    assert 32 <= batch_size < 4096  # the budget binds
