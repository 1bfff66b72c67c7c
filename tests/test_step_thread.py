"""How long a stop waits for the step thread: a wait for data is parked after
``loader_grace_s`` where one rank can be parked, and given ``grace_s`` like a step where
several ranks must vote and checkpoint together."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from core.loop.epoch import DataWait
from core.trainer.running.step_thread import StepThread


def slow_loader_job(
    wait: DataWait, stop: threading.Event, delivers_after_s: float, outcome: list[str]
) -> None:
    """A step thread's epoch: it waits for a batch that arrives ``delivers_after_s`` later,
    then stops at that boundary unless it was parked meanwhile."""
    wait.since = time.perf_counter()
    time.sleep(delivers_after_s)
    if not wait.end():
        outcome.append("parked")
    else:
        outcome.append("stopped at the boundary" if stop.is_set() else "stepped")


def step_thread(
    wait: DataWait, *, grace_s: float, loader_grace_s: float, parks: bool
) -> StepThread:
    """A step thread whose stops see ``wait``; ``parks``: one rank (a wait may be parked)."""
    return StepThread(
        threading.Event(),
        grace_s=grace_s,
        loader_grace_s=loader_grace_s,
        waiting_for_data=lambda: wait.since is not None,
        park=wait.park if parks else None,
    )


async def stop_during(thread: StepThread, wait: DataWait, delivers_after_s: float) -> str:
    """Start the job, cancel the caller while the thread waits for data, and return what the
    job ended with (the cancellation is the stop)."""
    outcome: list[str] = []
    task = asyncio.ensure_future(
        thread.call(slow_loader_job, wait, thread.stop, delivers_after_s, outcome)
    )
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return outcome[0] if outcome else "still waiting"


def test_one_rank_waiting_for_data_is_parked_after_loader_grace_s() -> None:
    wait = DataWait()
    thread = step_thread(wait, grace_s=10.0, loader_grace_s=0.2, parks=True)
    started = time.monotonic()
    assert asyncio.run(stop_during(thread, wait, delivers_after_s=1.5)) == "still waiting"
    assert thread.parked and not thread.abandoned and thread.waited_for_data
    assert time.monotonic() - started < 1.5  # the stop did not wait for the loader
    thread.close()


def test_several_ranks_wait_for_a_slow_loader_and_stop_together_at_the_boundary() -> None:
    # No park (several ranks): a loader slower than loader_grace_s but within grace_s
    # delivers, and the thread reaches its boundary, where the ranks vote and checkpoint.
    wait = DataWait()
    thread = step_thread(wait, grace_s=10.0, loader_grace_s=0.2, parks=False)
    assert asyncio.run(stop_during(thread, wait, delivers_after_s=1.0)) == (
        "stopped at the boundary"
    )
    assert not thread.parked and not thread.abandoned and not thread.waited_for_data
    thread.close()


def test_several_ranks_abandon_a_loader_hung_past_grace_s_and_say_it_waited_for_data() -> None:
    wait = DataWait()
    thread = step_thread(wait, grace_s=0.5, loader_grace_s=0.1, parks=False)
    assert asyncio.run(stop_during(thread, wait, delivers_after_s=3.0)) == "still waiting"
    assert thread.abandoned and thread.waited_for_data and not thread.parked


def test_call_through_returns_an_interruption_beside_the_result_it_waited_for() -> None:
    """What a rank of several does with a job that holds collectives (an epoch's end): the
    cancellation sets the stop flag, the job runs to its end, and both come back."""
    thread = StepThread(threading.Event(), grace_s=10.0)
    started = threading.Event()

    def epoch_end() -> str:
        started.set()
        time.sleep(0.3)
        return "validated"

    async def cancel_during() -> tuple[str, BaseException | None]:
        task = asyncio.ensure_future(thread.call_through(epoch_end))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        return await task

    result, interruption = asyncio.run(cancel_during())
    assert result == "validated" and isinstance(interruption, asyncio.CancelledError)
    assert thread.stop.is_set()
    thread.close()


def test_call_through_raises_the_interruption_where_the_job_failed() -> None:
    thread = StepThread(threading.Event(), grace_s=10.0)
    started = threading.Event()

    def failing() -> None:
        started.set()
        time.sleep(0.3)
        raise RuntimeError("validation_step failed")

    async def cancel_during() -> None:
        task = asyncio.ensure_future(thread.call_through(failing))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancel_during())
    thread.close()
