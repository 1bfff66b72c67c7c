"""Many runs in one service: cancellations that land anywhere in ``train()``'s start, and
stop requests made before the run exists, in thread and process mode alike.

One service (one ``asyncio.run``) starts run after run, as a service with a timeout per
training does; whatever moment a cancellation lands on, nothing may outlive ``train()``: no
training process, no step thread, no file descriptor (pidfd, pipe, shared block).
``benchmarks/cancel_storm.py`` is the storm this is a sharp sample of.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing.forkserver
import os
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import psutil
import pytest

from core import LoggingConfig, OptimizedTrainingOptimizer, RunConfig, TrainingConfig
from tests import isolation_parts as parts
from tests.test_reliability import records

FORMS = ("task.cancel", "wait_for", "asyncio.timeout")


def build(log_dir: Path, isolation: str, max_epochs: int = 2) -> OptimizedTrainingOptimizer:
    """A job not built yet (the class, not the factory that builds it): ``train()`` builds
    it, in thread mode on the service's side, in process mode in the training process."""
    config = TrainingConfig(
        run=RunConfig(
            experiment_name="many",
            log_dir=log_dir,
            max_epochs=max_epochs,
            seed=3,
            isolation=isolation,  # type: ignore[arg-type]
        ),
        logging=LoggingConfig(progress=False, reports=False),
    )
    return OptimizedTrainingOptimizer(
        config,
        model=parts.make_model(),
        train_loader=parts.SlowLoader(0.01),  # 12 steps an epoch, 10 ms a batch
        optimizer=parts.sgd,
    )


def open_fds() -> list[str]:
    """What this process's file descriptors are open on (``anon_inode:[pidfd]``, ``pipe:[n]``,
    ``/memfd:core-shared-block``...)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed meanwhile
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
    return sorted(targets)


def training_processes(earlier: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """This service's processes that are not done (zombies are): every descendant but the
    fork server, ``multiprocessing``'s resource tracker and those in ``earlier`` (started
    before: another test's report writer may still be drawing, at the lowest priority)."""
    server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    alive = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            command = " ".join(process.cmdline())
            if process.pid == server or process.pid in earlier or "resource_tracker" in command:
                continue
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def step_threads(earlier: frozenset[threading.Thread] = frozenset()) -> list[str]:
    """The step threads alive but those in ``earlier`` (another test's, abandoned on purpose
    in a step that never returns)."""
    alive = threading.enumerate()
    return [t.name for t in alive if t.name.startswith("core-step") and t not in earlier]


async def cancelled_at(train: Awaitable[Any], form: str, moment: int | float) -> None:
    """``train`` cancelled ``moment`` event-loop iterations (an int) or seconds (a float)
    after it was called, in one of the three native forms."""
    if isinstance(moment, int):
        task = asyncio.ensure_future(train)
        for _ in range(moment):
            await asyncio.sleep(0)
        task.cancel()
        await task
    elif form == "wait_for":
        await asyncio.wait_for(train, moment)
    elif form == "asyncio.timeout":
        async with asyncio.timeout(moment):
            await train
    else:
        task = asyncio.ensure_future(train)
        await asyncio.sleep(moment)
        task.cancel()
        await task


async def settled(condition: Any, timeout_s: float = 30.0) -> bool:
    """Whether ``condition()`` holds within ``timeout_s`` (a thread exits after its job; the
    bound is for a machine under heavy load, a healthy one settles in milliseconds)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    return bool(condition())


def test_a_native_cancel_at_any_moment_of_the_start_leaves_nothing_behind(tmp_path: Path) -> None:
    # Cancelled while the process was being started, a train() once raised at once while a
    # worker thread went on to start it: the child trained on, unsupervised. Cancelled
    # later, every train() left its pidfd open.
    moments: list[int | float] = [0, 1, 2, 3, 4, 6, 9, 14, 0.01, 0.02, 0.04, 0.08, 0.16, 0.3]

    async def service() -> list[tuple[str, Any, int]]:
        for isolation in ("process", "thread"):  # the fork server started, imports done
            await build(tmp_path / "warm", isolation, max_epochs=1).train()
        before = open_fds()
        earlier = frozenset(p.pid for p in psutil.Process().children(recursive=True))
        earlier_threads = frozenset(threading.enumerate())
        outcomes = []
        kept = []  # as a service's log keeps them: nothing may depend on their collection
        for trial, moment in enumerate(moments):
            for isolation in ("process", "thread"):
                case = (isolation, moment)
                log_dir = tmp_path / f"{trial}-{isolation}"
                job = build(log_dir, isolation)
                try:
                    await cancelled_at(job.train(), FORMS[trial % 3], moment)
                except (asyncio.CancelledError, TimeoutError) as exc:
                    kept.append(exc)
                assert training_processes(earlier) == [], case
                assert await settled(lambda: not step_threads(earlier_threads)), case
                assert open_fds() == before, case
                steps = 0
                if (log_dir / "many").is_dir():  # its run opened: it ended, and says how
                    ((*_, end),) = records(log_dir, "many")
                    assert end["status"] in ("cancelled", "completed"), (case, end)
                    steps = end["global_step"]
                if steps:  # it trained: its stop checkpoint holds every step
                    assert job.checkpoints.latest.step == steps, case
                outcomes.append((isolation, moment, steps))
        return outcomes

    outcomes = asyncio.run(service())
    for isolation in ("process", "thread"):  # the moments span the start and the first steps
        steps = [n for mode, _, n in outcomes if mode == isolation]
        assert steps[0] == 0 and max(steps) > 0, outcomes


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_stop_requested_as_train_begins_is_honoured_at_the_first_step(
    tmp_path: Path, isolation: str
) -> None:
    # Requested before the run's parts (thread) or the training process's job (process)
    # existed, the stop was refused, or accepted and dropped: the run trained all 24 steps.
    async def service() -> tuple[bool, Any, bool]:
        job = build(tmp_path, isolation)
        training = asyncio.ensure_future(job.train())
        await asyncio.sleep(0)  # train() has begun; nothing of its run exists yet
        accepted = job.request_stop("the operator's")
        results = await training
        return accepted, results, job.request_stop("too late")

    accepted, results, late = asyncio.run(service())
    assert accepted and not late
    assert (results.global_step, results.stop_reason) == (1, "requested: the operator's")
    (run,) = records(tmp_path, "many")
    assert (run[-1]["status"], run[-1]["global_step"]) == ("stopped", 1)
    saved = [r["step"] for r in run if r["event"] == "checkpoint" and r["reason"] == "requested"]
    assert saved == [1]
