"""The python block of docs/ray.md runs as written, on the session's Ray cluster."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.doc_blocks import python_blocks
from tests.helpers import pythonpath


@pytest.mark.ray
def test_the_ray_example_trains_on_the_cluster_as_written(tmp_path: Path, ray_cluster: Any) -> None:
    """A fresh interpreter finds the cluster as a user's program does (``RAY_ADDRESS``), and
    its run, trained in an actor, writes to the "shared" directory."""
    (program,) = python_blocks("docs/ray.md", "## A run on the cluster")
    assert 'isolation="ray"' in program and 'SHARED = "/mnt/shared/logs"' in program
    shared = tmp_path / "shared"
    program = program.replace('"/mnt/shared/logs"', repr(str(shared)))
    done = subprocess.run(
        [sys.executable, "-c", program],
        check=False,
        cwd=Path(__file__).resolve().parents[1],  # the Ray job's directory: examples importable
        capture_output=True,
        text=True,
        timeout=180,
        env={
            "PYTHONPATH": pythonpath(),
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
            "RAY_ADDRESS": ray_cluster.address,
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The program's one line; the actor's log lines come to the same stdout (Ray's way).
    (printed,) = re.findall(r"^(\d+) (/\S+)$", done.stdout, flags=re.M)
    steps, run_dir = printed
    assert steps == "16" and Path(run_dir).parent.parent == shared
    written = [json.loads(line) for line in (Path(run_dir) / "events.jsonl").open()]
    isolation = written[0]["resolved"]["isolation"]
    assert isolation["mode"] == "ray" and written[-1]["status"] == "completed"
    assert not list(shared.rglob(".core-shared-*"))  # the storage markers are gone
