"""One rank of a ``devices=N`` job, started by torch's elastic launcher: it rebuilds the job
from what crossed and trains it as a rank of a torchrun job does.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from core.config import TrainingConfig
from core.distributed.environment import DistributedEnvironment
from core.trainer.process import child
from core.trainer.process.pipe import Sender
from core.trainer.process.shared import Packed

__all__ = ("CANCEL", "STOP_MARGIN_S", "rank_main")

# What the launcher sends itself on a cancel: torch's agent passes it to every rank, where it
# cancels train() (SIGTERM and SIGINT stay the signals a run reports as such).
CANCEL = signal.SIGHUP
STOP_MARGIN_S = 15  # past stop_grace_s, for a stopping rank to write its checkpoint and exit


def rank_main(
    job_class: Any,
    config: TrainingConfig,
    packed: Packed,
    records: Connection,
    stops: Connection,
    errors: str,
) -> tuple[Any, str | None] | None:
    """One rank: rank 0 returns ``(results, final weights)`` and takes the caller's stop
    requests; an exception is pickled into ``errors`` for the launcher to raise."""
    env = DistributedEnvironment.from_environ()
    rank = env.rank if env is not None else 0
    if rank != 0:
        records.close()
        stops.close()
    try:
        return asyncio.run(_train_rank(job_class, config, packed, (records, stops), rank))
    except asyncio.CancelledError:  # stopped at its checkpoint; torch's agent is shutting down
        # and would never collect a return value (the rank would wait for it, then be killed)
        raise SystemExit(128 + CANCEL) from None
    except BaseException as exc:
        _keep(exc, Path(errors), rank)
        raise


async def _train_rank(
    job_class: Any,
    config: TrainingConfig,
    packed: Packed,
    pipes: tuple[Connection, Connection],
    rank: int,
) -> tuple[Any, str | None] | None:
    records, stops = pipes
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(CANCEL, task.cancel)
    _watch_parent(loop, task, config.run.stop_grace_s + STOP_MARGIN_S)
    sender = Sender(records) if rank == 0 else None
    try:
        mode = f"rank {rank} of {config.distributed.devices}"
        job = child.rebuilt(job_class, config, packed, sender, mode, private=True)  # its own copy
        if rank == 0:  # requests reach the job on this event loop, once train() has begun
            _take_stop_requests(stops, loop, job.request_stop)
        ended = await child.train_and_hand_back(job, packed)
        return ended if rank == 0 else None
    finally:
        if sender is not None:
            sender.close()


def _take_stop_requests(
    stops: Connection, loop: asyncio.AbstractEventLoop, request_stop: Callable[[str], object]
) -> None:
    """Each reason the launcher passes on becomes rank 0's ``request_stop`` (the others follow
    at the step boundary they vote for)."""

    def take() -> None:
        try:
            while True:
                reason = stops.recv()
                loop.call_soon_threadsafe(request_stop, reason)
        except (EOFError, OSError, RuntimeError):  # the launcher is gone, or the run ended
            return

    threading.Thread(target=take, name="core-stop-requests", daemon=True).start()


def _watch_parent(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], grace_s: float) -> None:
    """The launcher gone: cancel this rank's run; exit if it has not ended ``grace_s`` later."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the run already ended
            return
        time.sleep(grace_s)
        os._exit(1)

    threading.Thread(target=watch, name="core-parent-watch", daemon=True).start()


def _keep(error: BaseException, errors: Path, rank: int) -> None:
    """``error`` pickled for the launcher, with this rank's traceback as a note (3.11+)."""
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note(f"(raised in rank {rank}: {''.join(traceback.format_exception(error))})")
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
    except Exception:
        data = pickle.dumps(RuntimeError(f"rank {rank}: {type(error).__name__}: {error}"))
    (errors / f"rank{rank}.pickle").write_bytes(data)
