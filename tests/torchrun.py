"""Launching tests/distributed_jobs.py under torchrun, and reading what its scenarios saved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from tests.helpers import pythonpath

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "tests" / "distributed_jobs.py"
SCENARIOS = (
    "ddp_fp32",
    "seed004_train",
    "ddp_bf16",
    "ddp_accum",
    "ddp_oom_rank1",
    "ddp_auto_batch",
    "ddp_tokens",
    "ddp_shuffle",
    "fsdp_fp32",
    "fsdp_bf16_policy",
    "fsdp_resume",
    "early_stop",
    "cancel_rank1",
    "cancel_rank0_at_epoch_end",
    "cancel_rank0_in_an_epoch",
    "uneven_stream",
    "slow_rank_heartbeat",
    "ep_fp32",
    "ep_all_gather",
    "ep_accum",
    "ep_bf16",
    "ep_fp16",
    "ep_resume",
)
"""What the session's one torchrun launch (the ``jobs`` fixture) runs."""


def torchrun(
    out: Path,
    *scenarios: str,
    extra: list[str] | None = None,
    timeout: float = 240,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *(extra or ["--standalone", "--nproc_per_node=2"]),
        str(JOBS),
        "--out",
        str(out),
        *scenarios,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def load(out: Path, name: str, rank: int = 0) -> dict[str, Any]:
    result: dict[str, Any] = torch.load(out / f"{name}.rank{rank}.pt", weights_only=True)
    return result


def assert_same_weights(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-5
) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        torch.testing.assert_close(value, b[key], atol=atol, rtol=1e-5, msg=key)
