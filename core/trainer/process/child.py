"""The training process: the same job as in thread mode, its records relayed to the parent.

Started from the supervisor's fork server in a process group of its own (a terminal's Ctrl-C
reaches the service, which decides) at a lower CPU priority (``NICENESS``), it builds the job
from what crossed, trains it under asyncio and ends with one ``ended`` message. A ``"cancel"``,
or the control pipe's end-of-file (the service is gone), cancels the run as in thread mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from core.callbacks import Callback, Record, RunInfo
from core.checkpointing.store import CheckpointStore
from core.config import TrainingConfig
from core.trainer.process.crossing import Crossing
from core.trainer.process.handback import HandBack
from core.trainer.process.pipe import Sender, until_cancelled
from core.trainer.process.shared import Packed
from core.trainer.state.results import TrainingResults

__all__ = (
    "FINAL_WEIGHTS",
    "HEARTBEAT_S",
    "NICENESS",
    "discard_handed_back",
    "hand_back",
    "main",
    "rebuilt",
    "train_and_hand_back",
)

FINAL_WEIGHTS = "final_weights"
_SCRATCH = "core-final-"
HEARTBEAT_S = 1.0
NICENESS = 10  # below the service's: its event loop is scheduled first where cores are short


class Relay(Callback):
    """Forwards every record, and the run's directory once it exists, to the parent."""

    def __init__(self, sender: Sender) -> None:
        self._sender = sender

    def follow(self, job: Any) -> None:
        """Tell the parent ``job``'s run directory as the run opens it, before its records (a
        process dying at its first steps has said whose checkpoints are whose)."""
        job.when_opened(lambda run_dir: self._sender.put(("opened", str(run_dir))))

    async def on_record(self, run: RunInfo, record: Record) -> None:
        self._sender.put(("records", [record]))


def rebuilt(
    job_class: Any,
    config: TrainingConfig,
    packed: Packed,
    sender: Sender | None,
    mode: str,
    *,
    private: bool = False,
) -> Any:
    """The job rebuilt from what crossed (``private``: on its own copy of the tensors),
    relaying its records through ``sender`` (if any); ``mode`` is where it trains."""
    # In its own step thread, stopped by signals, without a progress bar (the parent's draws one).
    run = replace(config.run, isolation="thread", handle_signals=True)
    config = replace(config, run=run, logging=replace(config.logging, progress=False))
    relays = [] if sender is None else [Relay(sender)]
    job = job_class(config, callbacks=relays, **Crossing.unpack(packed, private=private))
    for relay in relays:
        relay.follow(job)
    job.isolation = {
        "mode": mode,
        "crossing": "shared_memory",
        "tensor_bytes": packed.tensor_bytes,
        "hand_back": "shared_memory" if packed.model else "checkpoint",
    }
    return job


async def train_and_hand_back(job: Any, packed: Packed) -> tuple[TrainingResults, str | None]:
    """``job.train()``, then the trained weights handed back; the job closed either way."""
    try:
        results = await job.train()  # the process's first await: an earlier stop is held
        final = await asyncio.to_thread(hand_back, packed, job, results)
    finally:
        await job.aclose()
    return results, final


def save_final_weights(state: dict[str, Any], run_dir: Path, step: int, epoch: int) -> Path:
    """The model's weights as a checkpoint (manifest with sha256) the parent verifies."""
    store = CheckpointStore(run_dir / FINAL_WEIGHTS, keep_last_n=1)
    staging = store.stage(step)
    store.write_state(staging, {"model": state})
    return store.commit(staging, step, {"epoch": epoch, "reason": "final"})


def hand_back(packed: Packed, job: Any, results: TrainingResults) -> str | None:
    """The trained weights back into the shared memory they crossed in (None), or, where they
    do not fit the given model, a verified checkpoint's path. Under FSDP2 every rank calls it."""
    state = job.distribution.strategy.model_state_dict(job.model)
    if job.distribution.strategy.rank != 0 or HandBack(packed).write(state):
        return None
    # A smoke run keeps no run directory: its weights cross through a temporary folder.
    run_dir = results.run_dir or Path(tempfile.mkdtemp(prefix=_SCRATCH))
    final = save_final_weights(state, run_dir, results.global_step, results.epochs_completed)
    return str(final)


def discard_handed_back(final: str) -> None:
    """In the service, once loaded: remove the temporary folder of a smoke run's weights."""
    scratch = Path(final).parent.parent
    if scratch.name.startswith(_SCRATCH) and scratch.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(scratch, ignore_errors=True)


def _listen(
    control: Connection,
    loop: asyncio.AbstractEventLoop,
    task: asyncio.Task[Any],
    request_stop: Callable[[str], object],
) -> None:
    """Cancel ``task`` on ``"cancel"`` or the parent's end-of-file; pass a
    ``("stop", reason)`` to ``request_stop``."""

    def wait() -> None:
        with contextlib.suppress(RuntimeError):  # the run ended: its event loop is closed
            until_cancelled(control, lambda reason: loop.call_soon_threadsafe(request_stop, reason))
            loop.call_soon_threadsafe(task.cancel)

    threading.Thread(target=wait, name="core-pipe-control", daemon=True).start()


async def _train(
    job_class: Any, config: TrainingConfig, packed: Packed, sender: Sender, control: Connection
) -> None:
    task = asyncio.current_task()
    assert task is not None
    job: Any = None

    def request_stop(reason: str) -> None:
        # Called on this event loop, so never before job.train() has begun (nothing awaits
        # before it): the job holds the request until its run takes it at its first step.
        if job is not None:
            job.request_stop(reason)

    _listen(control, asyncio.get_running_loop(), task, request_stop)
    beat = asyncio.create_task(_heartbeat(sender))
    try:
        job = rebuilt(job_class, config, packed, sender, "process")
        sender.put(("ended", "completed", await train_and_hand_back(job, packed)))
    except asyncio.CancelledError:
        last = job.last_checkpoint if job is not None and job.run_dir is not None else None
        sender.put(("ended", "cancelled", last))
    except Exception as exc:
        sender.put(("ended", "failed", exc))
    finally:
        beat.cancel()


async def _heartbeat(sender: Sender) -> None:
    """Tell the parent this process's event loop still runs (it kills a silent one)."""
    while True:
        sender.put(("alive",))
        await asyncio.sleep(HEARTBEAT_S)


def main(
    job_class: Any,
    config: TrainingConfig,
    packed: Packed,
    control: Connection,
    out: Connection,
    threads: int,
) -> None:
    """The training process's entry point. ``job_class`` (the job's own class) is passed so
    this module does not import the job that imports it; ``threads`` is its share of the
    service's."""
    os.setpgrp()
    os.nice(NICENESS)
    torch.set_num_threads(threads)
    sender = Sender(out)
    try:
        asyncio.run(_train(job_class, config, packed, sender, control))
    finally:
        sender.close()
        out.close()
