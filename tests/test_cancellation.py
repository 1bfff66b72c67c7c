"""Stopping a run the way asyncio applications do, and when something hangs.

Every native form of cancellation (``task.cancel()``, ``asyncio.wait_for``,
``asyncio.timeout``, Ctrl-C under ``asyncio.run``) must checkpoint only after the step thread
has stopped at a step boundary: the resumed run ends ``torch.equal`` to an uninterrupted
one. A stop that cannot reach a boundary (a hung loader) returns control within
``stop_grace_s``; a repeated signal never kills the run before its checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from core.callbacks import Callback, Record, RunInfo
from core.checkpointing.store import CheckpointStore
from tests.helpers import train_steps, wait_for
from tests.test_reliability import (
    ENV,
    JOB,
    assert_equal_states,
    assert_same_as_uninterrupted,
    build,
    job,
    records,
    step_losses,
)

FORMS = ("task.cancel", "wait_for", "timeout")


async def cancel_natively(optimizer: Any, form: str, after_s: float) -> None:
    """Run ``train()`` and interrupt it after ``after_s`` seconds with plain asyncio."""
    if form == "wait_for":
        await asyncio.wait_for(optimizer.train(), timeout=after_s)
    elif form == "timeout":
        async with asyncio.timeout(after_s):
            await optimizer.train()
    else:
        task = asyncio.create_task(optimizer.train())
        await asyncio.sleep(after_s)
        task.cancel()
        await task


def test_native_asyncio_cancellation_20_times_then_resume_is_exact(tmp_path: Path) -> None:
    reference = build(tmp_path / "ref", 1)
    started = time.perf_counter()
    asyncio.run(reference.train())
    duration = time.perf_counter() - started
    rng = random.Random()
    stopped_mid_run = 0
    for trial in range(20):
        form = FORMS[trial % len(FORMS)]
        root = tmp_path / f"{trial}-{form}"
        interrupted = build(root, 1)
        try:
            # One random moment in each twentieth of the run's first 80% (its end is closing
            # the run, where a cancellation has nothing left to stop).
            after_s = 0.8 * duration * (trial + rng.random()) / 20
            asyncio.run(cancel_natively(interrupted, form, after_s))
        except (asyncio.CancelledError, TimeoutError):
            stopped_mid_run += 1
            newest = [c.path for c in interrupted.checkpoints]
            if interrupted.global_step:
                # the stop checkpoint is that of the last step run, never one behind
                assert int(newest[0].name.split("-")[1]) == interrupted.global_step, form
        resumed = build(root, 1, resume="auto")
        asyncio.run(resumed.train())
        assert resumed.global_step == reference.global_step, (trial, form)
        for a, b in zip(resumed.model.parameters(), reference.model.parameters(), strict=True):
            assert torch.equal(a, b), (trial, form)
        assert_equal_states(resumed.optimizer.state_dict(), reference.optimizer.state_dict())
        assert resumed.scheduler.state_dict() == reference.scheduler.state_dict()
        ours = step_losses(records(root, "resume"))
        assert ours == step_losses(records(tmp_path / "ref", "resume")), (trial, form)
    # Most trials are cut short; fewer when the machine speeds up after the reference was timed.
    assert stopped_mid_run >= 5


class Busy(Callback):
    """A callback with records in hand when the run is cancelled."""

    async def on_record(self, run: RunInfo, record: Record) -> None:
        await asyncio.sleep(0)


STEPS_PER_EPOCH = 13  # 200 samples in batches of 16, 3 epochs: 39 steps


def tiny_run(log_dir: Path, **kwargs: Any) -> Any:
    """A deterministic run: the same seeded model, the same batches in the same order
    (``shuffle=False``, no dropout), whatever is cancelled or cut short by ``max_steps``."""
    from core import create_optimized_training_optimizer
    from tests.helpers import make_classification, make_model

    loader = DataLoader(make_classification(200), batch_size=16, shuffle=False)
    return create_optimized_training_optimizer(
        model=make_model(seed=11),
        train_loader=loader,
        max_epochs=3,
        learning_rate=1e-2,
        seed=3,
        scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.8),
        log_dir=log_dir,
        experiment_name="resume",
        **kwargs,
    )


def weights_after_each_step(log_dir: Path, steps: int) -> list[dict[str, torch.Tensor]]:
    """The weights of ``tiny_run`` after 0, 1, ... ``steps`` optimizer steps: one run of
    ``max_steps=steps``, read before each step's forward (one per step: no accumulation, no
    validation) and at its end."""
    run = tiny_run(log_dir, max_steps=steps)
    seen: list[dict[str, torch.Tensor]] = []

    def weights() -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in run.model.state_dict().items()}

    run.model.register_forward_pre_hook(lambda module, args: seen.append(weights()))
    assert asyncio.run(run.train()).global_step == steps
    seen.append(weights())
    assert len(seen) == steps + 1
    return seen


def test_a_native_cancellation_at_any_moment_ends_the_run_and_its_callbacks(
    tmp_path: Path,
) -> None:
    # A cancellation that lands while the run closes (a callback still busy) once left the
    # callbacks' streams open and train() waiting for them forever; one that landed while
    # the run opened its log wrote run_end with status "failed". Wherever it lands, the stop
    # checkpoint holds the weights of exactly the steps the records count.
    from core import load_weights
    from tests.helpers import make_model

    stopped: list[tuple[Any, int, dict[str, torch.Tensor]]] = []  # case, step, weights
    for trial, after_s in enumerate((0.0, 0.001, 0.003, 0.006, 0.01, 0.02, 0.04, 0.08)):
        for form in FORMS:
            case = (after_s, form)
            log_dir = tmp_path / f"{trial}-{form}"
            optimizer = tiny_run(log_dir, callbacks=[Busy()])
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                asyncio.run(cancel_natively(optimizer, form, after_s))
            steps = optimizer.global_step
            saved = list(optimizer.checkpoints)
            if not (log_dir / "resume").is_dir():  # cancelled before the run opened its log
                assert steps == 0 and not saved, case
                continue
            (run,) = records(log_dir, "resume")
            ends = [r for r in run if r["event"] == "run_end"]
            assert [e["status"] for e in ends] in (["cancelled"], ["completed"]), (case, ends)
            (end,) = ends
            assert end["global_step"] == steps, case
            assert len([r for r in run if r["event"] == "train_step"]) == steps, case
            if steps == 0:  # nothing trained, nothing to save
                assert end["last_checkpoint"] is None and not saved, case
                continue
            # The stop checkpoint: the newest, named by run_end and by a checkpoint record,
            # holding the steps run_end counts (at an epoch's end, that epoch's checkpoint).
            stop = saved[0]
            assert Path(end["last_checkpoint"]) == stop.path and stop.step == steps, case
            assert stop.reason == "cancel" or steps % STEPS_PER_EPOCH == 0, (case, stop)
            written = [r for r in run if r["event"] == "checkpoint"][-1]
            assert (Path(written["path"]), written["step"]) == (stop.path, steps), case
            model = make_model(seed=5)  # other weights, all overwritten
            loaded = load_weights(stop.path, model)
            assert (loaded.step, loaded.epoch) == (steps, end["epochs_completed"]), case
            weights = model.state_dict()
            for name, value in optimizer.model.state_dict().items():
                assert torch.equal(weights[name], value), (case, name)  # the run's own
            stopped.append((case, steps, weights))
    # The reference: one uninterrupted run of the same seed and batches, read at each step.
    assert stopped, "no cancellation came after a step"
    reference = weights_after_each_step(tmp_path / "ref", max(n for _, n, _ in stopped))
    for case, steps, weights in stopped:
        for name, value in reference[steps].items():
            assert torch.equal(weights[name], value), (case, steps, name)


# Ctrl-C under asyncio.run with the default settings (handle_signals=False) -------------
def start(out: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(JOB), "--out", str(out), *args]
    return subprocess.Popen(
        command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(2))  # a random moment each
def test_ctrl_c_under_asyncio_run_then_resume_is_exact(
    tmp_path: Path, uninterrupted: Path, trial: int
) -> None:
    process = start(tmp_path, "--runner", "asyncio", "--slow-s", "0.01")
    wait_for(lambda: train_steps(tmp_path) >= 2, process)
    time.sleep(random.uniform(0.0, 0.2))
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    (run,) = records(tmp_path / "logs")
    assert run[-1]["event"] == "run_end" and run[-1]["status"] == "cancelled"
    done = job(tmp_path, "--runner", "asyncio", "--resume", "auto", "--slow-s", "0.01")
    assert done.returncode == 0, done.stdout + done.stderr
    assert_same_as_uninterrupted(tmp_path, uninterrupted)


# Signals twice and three times (handle_signals=True) ------------------------------------
@pytest.mark.slow
# SIGINT (Ctrl-C twice); SIGTERM's exit code 143 is checked by the reliability suite's test 5.
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130)])
def test_a_second_signal_hurries_and_still_checkpoints(
    tmp_path: Path, uninterrupted: Path, signum: int, code: int
) -> None:
    process = start(tmp_path, "--pause-at-call", "5")  # both come while step 5 runs
    wait_for((tmp_path / "paused").exists, process)
    process.send_signal(signum)
    time.sleep(0.02)
    process.send_signal(signum)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == code, output
    assert "Traceback" not in output
    (run,) = records(tmp_path / "logs")
    hurried = [r for r in run if r["event"] == "signal_received"]
    assert [r["action"] for r in hurried] == ["hurry"]
    saved = [r for r in run if r["event"] == "checkpoint"][-1]
    assert saved["reason"] == "signal" and saved["step"] == run[-1]["global_step"] == 5
    assert job(tmp_path, "--resume", "auto", "--slow-s", "0.01").returncode == 0
    assert_same_as_uninterrupted(tmp_path, uninterrupted)


@pytest.mark.slow
def test_a_third_signal_exits_at_once_naming_the_last_checkpoint(tmp_path: Path) -> None:
    process = start(tmp_path, "--stall-commit-from-step", "4")  # the stop save never commits
    wait_for((tmp_path / "stalled").exists, process)
    for _ in range(3):
        process.send_signal(signal.SIGTERM)
        time.sleep(0.1)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 143, output
    assert "forced exit by a third SIGTERM" in output
    assert "step-000000002" in output  # the last committed checkpoint
    store = CheckpointStore(tmp_path / "logs" / "faults" / "checkpoints", keep_last_n=3)
    newest = store.newest_valid(lambda p, r: None)
    assert newest is not None and newest.name.startswith("step-000000002-")


# A hung loader, a stuck step ----------------------------------------------------------
def events(out: Path) -> list[dict[str, Any]]:
    runs = sorted((out / "logs" / "faults").glob("*/events.jsonl"))
    return [json.loads(line) for line in runs[-1].read_text().splitlines()] if runs else []


@pytest.mark.slow
def test_sigterm_with_a_loader_that_never_yields_checkpoints_at_once_then_resumes_exactly(
    tmp_path: Path, uninterrupted: Path
) -> None:
    # Defaults: stop_grace_s 30 s, loader_grace_s 1 s; the data_stall warning after 0.5 s,
    # not its default 10 s, which would only make the test wait (its backoff is tested below).
    process = start(tmp_path, "--hang-loader-at-batch", "5", "--data-stall-warn-s", "0.5")
    wait_for((tmp_path / "loader_hung").exists, process)
    wait_for(lambda: any(r["event"] == "data_stall" for r in events(tmp_path)), process, 30)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    took = time.monotonic() - sent
    assert process.returncode == 143, output
    assert took < 10, took  # the loader is never waited for stop_grace_s (30 s)
    assert "step-000000005" in output and "written" in output
    run = events(tmp_path)
    (parked,) = [r for r in run if r["event"] == "step_thread_parked"]
    assert parked["step"] == 5 and parked["waited_s"] < 2
    saved = [r for r in run if r["event"] == "checkpoint"][-1]
    assert saved["reason"] == "signal" and saved["step"] == 5
    assert run[-1]["event"] == "run_end" and run[-1]["status"] == "stopped"
    # The same loader (its settings are checked at resume), this time never hanging.
    resumed = job(
        tmp_path,
        "--resume",
        "auto",
        "--hang-loader-at-batch",
        "1000000",
        "--data-stall-warn-s",
        "0.5",
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_same_as_uninterrupted(tmp_path, uninterrupted)


@pytest.mark.slow
def test_a_second_signal_cuts_a_stuck_step_short(tmp_path: Path) -> None:
    # A step that never ends (a forward that hangs) with a 60 s stop grace: the second
    # SIGTERM gives it at most HURRY_S more.
    from core.trainer.running.step_thread import HURRY_S

    process = start(tmp_path, "--hang-rank", "0", "--hang-at-call", "6", "--stop-grace-s", "60")
    wait_for((tmp_path / "hanging.rank0").exists, process)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    took = time.monotonic() - sent
    assert process.returncode == 143, output
    assert took < HURRY_S + 8, took
    assert "did not reach a step boundary" in output and "step-000000004" in output
    run = events(tmp_path)
    (abandoned,) = [r for r in run if r["event"] == "step_thread_abandoned"]
    assert abandoned["waiting_for"] == "step"
    assert HURRY_S - 0.5 <= abandoned["waited_s"] <= HURRY_S + 1.5
    assert run[-1]["status"] == "abandoned"
    assert run[-1]["last_checkpoint"].rsplit("/", 1)[1].startswith("step-000000004-")


class StallingLoader:
    """Yields ``before`` batches, then blocks until ``release`` is set (never, unless a test
    sets it)."""

    def __init__(self, batches: list[Any], before: int) -> None:
        self.batches, self.before = batches, before
        self.release = __import__("threading").Event()

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        for index, batch in enumerate(self.batches):
            if index == self.before:
                self.release.wait()
            yield batch


def stalling_job(log_dir: Path, **kwargs: Any) -> tuple[Any, StallingLoader]:
    from core import create_optimized_training_optimizer
    from tests.helpers import make_classification, make_model

    data = make_classification(64)
    batches = [(data.tensors[0][i : i + 8], data.tensors[1][i : i + 8]) for i in range(0, 64, 8)]
    loader = StallingLoader(batches, before=3)
    optimizer = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=loader,
        max_epochs=1,
        log_dir=log_dir,
        checkpoint_every_n_steps=2,
        **kwargs,
    )
    return optimizer, loader


def test_anyio_fail_after_returns_promptly_when_the_loader_never_yields(tmp_path: Path) -> None:
    import anyio

    from core import CSVLogger, load_weights
    from tests.helpers import make_model

    # Defaults (stop_grace_s 30 s), a tracker that waits for reports when a run completes.
    optimizer, loader = stalling_job(tmp_path, callbacks=[CSVLogger()])

    async def main() -> None:
        with anyio.fail_after(1.0):
            await optimizer.train()

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        anyio.run(main)
    assert time.monotonic() - started < 5  # 1 s + loader_grace_s (1 s) + closing
    run = [json.loads(x) for x in (optimizer.run_dir / "events.jsonl").read_text().splitlines()]
    assert [r["step"] for r in run if r["event"] == "step_thread_parked"] == [3]
    end = run[-1]
    assert end["status"] == "cancelled" and optimizer.global_step == 3
    saved = Path(end["last_checkpoint"])
    assert saved.name.startswith("step-000000003-")
    # The parked thread never steps again, even when its loader finally returns.
    before = {k: v.clone() for k, v in optimizer.model.state_dict().items()}
    loader.release.set()
    time.sleep(0.3)
    after = optimizer.model.state_dict()
    assert optimizer.global_step == 3 and all(torch.equal(before[k], after[k]) for k in before)
    fresh = make_model()
    loaded = load_weights(saved, fresh)
    assert loaded.step == 3
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())


def test_a_data_stall_is_reported_with_backoff_and_the_run_goes_on(tmp_path: Path) -> None:
    optimizer, loader = stalling_job(tmp_path, data_stall_warn_s=0.2)

    async def main() -> Any:
        async def release_later() -> None:
            await asyncio.sleep(1.0)
            loader.release.set()

        releaser = asyncio.create_task(release_later())
        results = await optimizer.train()
        await releaser
        return results

    results = asyncio.run(main())
    assert results.global_step == 8
    lines = (optimizer.run_dir / "events.jsonl").read_text().splitlines()
    stalls = [json.loads(x) for x in lines if '"data_stall"' in x]
    assert 2 <= len(stalls) <= 3  # after 0.2 s, 0.4 s, 0.8 s of the same 1 s wait
    assert all(s["level"] == "warning" and s["batch_index"] == 3 for s in stalls)
    waits = [s["waited_s"] for s in stalls]
    assert waits == sorted(waits) and waits[0] >= 0.2
