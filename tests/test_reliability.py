"""Fault injection: every reliability promise of the docs, proven by breaking a run.

Numbers in the test names follow the issue's list. Where a process must die, it is a real
process (tests/fault_jobs.py, alone or under torchrun); the rest run in-process.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from core import GradientAccumulationConfig, create_optimized_training_optimizer
from core.checkpointing.store import CheckpointStore
from core.errors import NonFiniteLossError, UnsafeCheckpointError
from core.precision.cpu_bf16 import cpu_has_native_bf16
from tests.helpers import make_classification, pythonpath

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "fault_jobs.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}


def job(out: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(JOB), "--out", str(out), *args]
    return subprocess.run(
        command, env=ENV, capture_output=True, text=True, timeout=timeout, check=False
    )


def torchrun_job(
    out: Path, *args: str, extra: tuple[str, ...] = (), timeout: float = 240
) -> tuple[subprocess.CompletedProcess[str], float]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *extra,
        str(JOB),
        "--out",
        str(out),
        *args,
    ]
    started = time.monotonic()
    done = subprocess.run(
        command, env=ENV, capture_output=True, text=True, timeout=timeout, check=False
    )
    return done, time.monotonic() - started


def final(out: Path, rank: int = 0) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(
        out / f"final.rank{rank}.pt", map_location="cpu", weights_only=True
    )  # a thread-mode run saves its GPU tensors, a process-mode one the caller's CPU copy
    return state


def records(log_dir: Path, experiment: str = "faults") -> list[list[dict[str, Any]]]:
    """Each run's records (oldest run first)."""
    runs = sorted(p for p in (log_dir / experiment).iterdir() if p.name != "checkpoints")
    return [
        [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()] for run in runs
    ]


def step_losses(runs: list[list[dict[str, Any]]]) -> dict[int, float]:
    """Loss per step, a later run overriding what an earlier one logged past its resume point."""
    merged: dict[int, float] = {}
    for run in runs:
        resumed = next((r["step"] for r in run if r["event"] == "resumed"), 0)
        merged = {s: v for s, v in merged.items() if s <= resumed}
        merged.update({r["step"]: r["loss"] for r in run if r["event"] == "train_step"})
    return merged


def assert_equal_states(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_equal_states(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal_states(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def assert_same_as_uninterrupted(out: Path, reference: Path) -> None:
    ours, theirs = final(out), final(reference)
    for key in ("model", "optimizer", "scheduler", "global_step"):
        assert_equal_states(ours[key], theirs[key], key)
    assert_equal_states(ours["precision"]["precision"], theirs["precision"]["precision"], "scaler")
    assert step_losses(records(out / "logs")) == step_losses(records(reference / "logs"))


# 1 -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_1_sigkill_at_a_random_step_then_resume_is_exact(
    tmp_path: Path, uninterrupted: Path
) -> None:
    kill_at = random.Random().randint(3, 30)  # a forward call: mid-step as often as not
    killed = job(tmp_path, "--kill-at-call", str(kill_at))
    assert killed.returncode == -signal.SIGKILL
    assert job(tmp_path, "--resume", "auto").returncode == 0
    assert_same_as_uninterrupted(tmp_path, uninterrupted)


# 2 and 12 ------------------------------------------------------------------------------
def loaders_for(n: int = 200, batch: int = 16) -> DataLoader[Any]:
    return DataLoader(make_classification(n), batch_size=batch, shuffle=True)


def build(log_dir: Path, accumulation: int, **kwargs: Any) -> Any:
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.Tanh(), nn.Linear(16, 2))
    return create_optimized_training_optimizer(
        model=model,
        train_loader=loaders_for(),
        max_epochs=3,
        learning_rate=1e-2,
        seed=3,
        gradient_accumulation_config=GradientAccumulationConfig(accumulation),
        scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.8),
        log_dir=log_dir,
        experiment_name="resume",
        **kwargs,
    )


async def cancel_after(optimizer: Any, step: int) -> None:
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while optimizer.global_step < step:
                await anyio.sleep(0.0005)
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        await optimizer.train()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(
    ("accumulation", "stop_at"),
    [(1, 4), (1, 17), (3, 6)],  # mid-epoch 0, mid-epoch 1; windows 3,3,3,3,1: mid-window tail
    ids=["mid-epoch", "second-epoch", "accumulation-short-window"],
)
async def test_2_12_cancel_mid_epoch_then_resume_gives_identical_losses_and_weights(
    tmp_path: Path, accumulation: int, stop_at: int
) -> None:
    reference = build(tmp_path / "ref", accumulation)
    await reference.train()
    interrupted = build(tmp_path / "run", accumulation)
    await cancel_after(interrupted, stop_at)
    saved = interrupted.checkpoints[0].path
    assert int(saved.name.split("-")[1]) == interrupted.global_step  # a step boundary
    assert interrupted.epochs_completed < 3
    resumed = build(tmp_path / "run", accumulation, resume="auto")
    results = await resumed.train()
    assert results.global_step == reference.global_step
    for a, b in zip(resumed.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert_equal_states(resumed.optimizer.state_dict(), reference.optimizer.state_dict())
    assert resumed.scheduler.state_dict() == reference.scheduler.state_dict()
    ours = step_losses(records(tmp_path / "run", "resume"))
    assert ours == step_losses(records(tmp_path / "ref", "resume"))


# 3 -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_3_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path: Path) -> None:
    command = [sys.executable, str(JOB), "--out", str(tmp_path), "--stall-commit-from-step", "6"]
    process = subprocess.Popen(
        command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "stalled").exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    store = CheckpointStore(tmp_path / "logs" / "faults" / "checkpoints", keep_last_n=3)
    staging = Path((tmp_path / "stalled").read_text())
    assert staging.exists() and (staging / "manifest.json").exists()  # fully written, not committed
    assert [p.name[:14] for p in store.committed()] == ["step-000000004", "step-000000002"]
    newest = store.newest_valid(lambda path, reason: pytest.fail(f"{path}: {reason}"))
    assert newest is not None and newest.name.startswith("step-000000004-")
    assert store.verify(newest)["step"] == 4
    assert store.load_state(newest)["trainer"]["global_step"] == 4
    assert job(tmp_path, "--resume", "auto").returncode == 0
    assert not staging.exists()  # swept on the next start
    assert final(tmp_path)["global_step"] == 36


# 4 -------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_4_truncated_newest_checkpoint_is_skipped_with_an_error_record(
    tmp_path: Path,
) -> None:
    first = build(
        tmp_path, 1, checkpoint_every_n_steps=5, checkpoint_every_n_epochs=None, keep_last_n=5
    )
    await cancel_after(first, 12)
    store = first._built.checkpointer.store
    newest, previous = store.committed()[:2]
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    second = build(tmp_path, 1, resume="auto", checkpoint_every_n_epochs=None)
    await second.train()
    run = records(tmp_path, "resume")[-1]
    errors = [r for r in run if r["event"] == "error" and r.get("kind") == "checkpoint_invalid"]
    assert len(errors) == 1 and errors[0]["path"] == str(newest) and errors[0]["level"] == "error"
    assert "bytes, the manifest says" in errors[0]["reason"]  # size is checked before hashing
    (resumed,) = (r for r in run if r["event"] == "resumed")
    assert resumed["path"] == str(previous)


# 5 -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_5_sigterm_to_the_example_checkpoints_exits_143_and_resume_completes(
    tmp_path: Path,
) -> None:
    example = ROOT / "examples" / "email_sequence" / "train.py"
    args = [
        sys.executable,
        str(example),
        "--epochs",
        "2",
        "--train-samples",
        "6000",
        "--val-samples",
        "500",
        "--log-dir",
        str(tmp_path),
        "--no-progress",
        "--checkpoint-every-n-steps",
        "10",
    ]
    process = subprocess.Popen(
        args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    checkpoints = tmp_path / "email_sequence" / "checkpoints"
    deadline = time.monotonic() + 120
    while not (
        checkpoints.exists() and any(p.name.startswith("step-") for p in checkpoints.iterdir())
    ):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 143, output
    store = CheckpointStore(checkpoints, keep_last_n=2)
    newest = store.committed()[0]
    manifest = store.verify(newest)
    assert manifest["reason"] == "signal"  # written after the step the signal interrupted
    done = subprocess.run(
        [*args, "--resume", "auto"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(next(checkpoints.parent.glob("*/results.json")).read_text())
    assert summary["epochs_completed"] == 2


# 6 -------------------------------------------------------------------------------------
class NaNAt(nn.Module):
    """Returns NaN outputs at chosen training forward calls (None: every call from ``start``)."""

    def __init__(self, calls: set[int] | None, start: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        self.calls, self.start, self.count = calls, start, 0
        self.snapshots: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        if not self.training:
            return out
        self.count += 1
        self.snapshots.append(self.net[0].weight.detach().clone())
        hit = self.count in self.calls if self.calls is not None else self.count >= self.start
        return out * float("nan") if hit else out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_6_nan_loss_skips_the_step_and_persistent_nan_stops(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    model = NaNAt({4})
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(make_classification(128), batch_size=16),
        max_epochs=1,
        amp_dtype=dtype,
        log_dir=tmp_path,
        checkpoint_every_n_epochs=None,
    )
    results = anyio.run(optimizer.train)
    assert results.global_step == 8
    assert torch.equal(model.snapshots[3], model.snapshots[4])  # step 4 left weights untouched
    assert not torch.equal(model.snapshots[4], model.snapshots[5])
    stats = json.loads((results.run_dir / "amp_stats.json").read_text())
    assert stats["nonfinite_steps"] == 1 and stats["skipped_steps"] == 1
    log = [json.loads(x) for x in (results.run_dir / "events.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["event"] == "nonfinite_skipped"] == [4]

    persistent = create_optimized_training_optimizer(
        model=NaNAt(None, start=3),
        max_epochs=1,
        amp_dtype=dtype,
        log_dir=tmp_path,
        train_loader=DataLoader(make_classification(512), batch_size=16),
        max_consecutive_nonfinite=10,
    )
    with pytest.raises(
        NonFiniteLossError, match=r"10 optimizer steps in a row, the last at step 12"
    ):
        anyio.run(persistent.train)
    assert persistent.global_step in (12, 13)  # the lagged readback sees step 12 during step 13


# 7 -------------------------------------------------------------------------------------
class OverflowInFP16(nn.Module):
    """Infinite gradients whenever it runs under fp16 autocast, finite otherwise."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        if self.training and out.dtype == torch.float16:
            out.register_hook(lambda g: torch.full_like(g, float("inf")))
        return out


def test_7_fp16_overflow_at_min_scale_falls_back_and_finishes(tmp_path: Path) -> None:
    optimizer = create_optimized_training_optimizer(
        model=OverflowInFP16(),
        train_loader=DataLoader(make_classification(256), batch_size=16),
        max_epochs=2,
        amp_dtype=torch.float16,
        amp_init_scale=16.0,
        amp_min_scale=1.0,
        log_dir=tmp_path,
        learning_rate=1e-2,
    )
    results = anyio.run(optimizer.train)
    assert results.epochs_completed == 2 and results.train_loss is not None
    log = [json.loads(x) for x in (results.run_dir / "events.jsonl").read_text().splitlines()]
    (fallback,) = (r for r in log if r["event"] == "precision_fallback")
    to = "fp32" if cpu_has_native_bf16() is False else "bf16"  # a CPU without bf16 instructions
    assert (fallback["from_precision"], fallback["to_precision"]) == ("fp16", to)
    # scale 16 -> 8 -> 4 -> 2 -> 1 (4 steps), then 3 overflows at min_scale: 7 skipped steps
    assert fallback["step"] == 7
    stats = optimizer.mixed_precision.get_amp_stats()
    assert stats["precision"] == to and stats["precision_fallbacks"] == [to]
    later = [r for r in log if r["event"] == "train_step" and r["step"] > 9]
    assert later and not any(r["skipped"] for r in later)


# 8 -------------------------------------------------------------------------------------
class OOMAbove(nn.Module):
    """Raises torch.OutOfMemoryError for batches larger than ``limit`` samples."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.shape[0]} rows")
        out: torch.Tensor = self.net(x)
        return out


def test_8_oom_halves_the_micro_batch_and_matches_a_run_started_there(tmp_path: Path) -> None:
    def run(model: nn.Module, micro: int | None) -> Any:
        optimizer = create_optimized_training_optimizer(
            model=model,
            train_loader=DataLoader(make_classification(160), batch_size=32),
            max_epochs=2,
            learning_rate=1e-2,
            log_dir=tmp_path,
            seed=0,
            gradient_accumulation_config=GradientAccumulationConfig(2, micro_batch_size=micro),
        )
        return optimizer, anyio.run(optimizer.train)

    recovered, results = run(OOMAbove(limit=10), None)
    assert recovered.describe()["gradient_accumulation"]["micro_batch_size"] == 8  # 32 -> 16 -> 8
    log = [json.loads(x) for x in (results.run_dir / "events.jsonl").read_text().splitlines()]
    assert [r["micro_batch_size"] for r in log if r["event"] == "oom_recovered"] == [16, 8]
    reference, _ = run(OOMAbove(limit=10), 8)
    for a, b in zip(recovered.model.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    with pytest.raises(Exception, match=r"out of memory with micro-batches of 1 sample"):
        run(OOMAbove(limit=0), None)


# 9 -------------------------------------------------------------------------------------
class Payload:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.target), "w"))


def test_9_a_pickled_payload_is_refused_and_never_runs(tmp_path: Path) -> None:
    checkpoint = tmp_path / "step-000000001"
    checkpoint.mkdir()
    target = tmp_path / "pwned"
    with (checkpoint / "state.pt").open("wb") as handle:
        pickle.dump({"model": Payload(target)}, handle)
    store = CheckpointStore(tmp_path, keep_last_n=1)
    with pytest.raises(
        UnsafeCheckpointError, match=r"refused to load .*state.pt: it holds pickled code"
    ):
        store.load_state(checkpoint)
    assert not target.exists()
    torch.save({"model": Payload(target)}, checkpoint / "state.pt")  # torch's own format
    with pytest.raises(UnsafeCheckpointError):
        store.load_state(checkpoint)
    assert not target.exists()


# 10 ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.distributed
def test_10_torchrun_restarts_a_rank_that_exited_and_the_job_resumes(tmp_path: Path) -> None:
    done, _ = torchrun_job(
        tmp_path,
        "--exit-rank",
        "1",
        "--exit-at-call",
        "9",
        "--resume",
        "auto",
        "--samples",
        "96",
        extra=("--max-restarts=1",),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (tmp_path / "exited_once").exists()
    runs = records(tmp_path / "logs")
    assert len(runs) == 2 and any(r["event"] == "resumed" for r in runs[1])
    assert final(tmp_path, 0)["global_step"] == final(tmp_path, 1)["global_step"] == 3 * 3


# 11 ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.distributed
def test_11_a_rank_that_never_reaches_a_collective_fails_both_within_the_timeout(
    tmp_path: Path,
) -> None:
    timeout_s = 5.0
    done, elapsed = torchrun_job(
        tmp_path,
        "--hang-rank",
        "1",
        "--hang-at-call",
        "4",
        "--timeout-s",
        str(timeout_s),
        "--samples",
        "96",
        "--stop-grace-s",
        "2",  # the hung rank is abandoned 2 s after SIGTERM
    )
    assert done.returncode != 0
    assert elapsed < timeout_s + 60
    output = done.stdout + done.stderr
    assert "DistributedTimeoutError: rank 0: a collective" in output
    assert "did not finish within timeout_s=5" in output
    assert "rank: 1" in output or "rank 1" in output  # torchrun reports the stopped rank
    marker = str(JOB)
    leftovers = [
        p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
    ]
    assert not leftovers
