"""The training process: the same job in thread mode, its records relayed to the parent.

Started by :mod:`core.trainer.process.supervisor` (from its fork server), in a process group
of its own (a terminal's Ctrl-C reaches the service, which decides) and at a lower CPU
priority than the service (``NICENESS``). It builds the job from what
crossed (``core.trainer.process.crossing``), trains it under asyncio with SIGTERM/SIGINT as
graceful stops, and ends with one ``ended`` message. On success it first writes the model's
final weights as a verified checkpoint under ``<run_dir>/final_weights/``, which the parent
loads into its own model. A ``"cancel"`` from the parent, or the parent's end (the control
pipe reads end-of-file: the service was killed), cancels the run: the stop checkpoint is
written as under a cancelled ``train()`` in thread mode.
"""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from core.callbacks import Callback, Record, RunInfo
from core.checkpointing.store import CheckpointStore
from core.config import TrainingConfig
from core.trainer.process.crossing import Crossing
from core.trainer.process.pipe import Sender

__all__ = ("FINAL_WEIGHTS", "HEARTBEAT_S", "NICENESS", "main")

FINAL_WEIGHTS = "final_weights"
HEARTBEAT_S = 1.0
NICENESS = 10
"""The training process's CPU priority below the service's: where they compete for cores,
the service's event loop is scheduled first (alone, training runs at full speed)."""


class Relay(Callback):
    """Forwards every record, and the run's directory once it exists, to the parent."""

    def __init__(self, sender: Sender) -> None:
        self._sender = sender

    async def on_run_start(self, run: RunInfo, record: Record) -> None:
        self._sender.put(("opened", record["run_dir"]))

    async def on_record(self, run: RunInfo, record: Record) -> None:
        self._sender.put(("records", [record]))


def training_config(config: TrainingConfig) -> TrainingConfig:
    """The parent's config as the training process runs it: in its own step thread, stopped
    gracefully by signals, no progress bar (the parent's callbacks draw one)."""
    run = replace(config.run, isolation="thread", handle_signals=True)
    return replace(config, run=run, logging=replace(config.logging, progress=False))


def save_final_weights(model: Any, run_dir: Path, step: int, epoch: int) -> Path:
    """The model's weights as a checkpoint (manifest with sha256) the parent verifies."""
    store = CheckpointStore(run_dir / FINAL_WEIGHTS, keep_last_n=1)
    staging = store.stage(step)
    store.write_state(staging, {"model": model.state_dict()})
    return store.commit(staging, step, {"epoch": epoch, "reason": "final"})


def _listen(control: Connection, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` on ``"cancel"`` or when the parent is gone (end-of-file)."""

    def wait() -> None:
        try:
            while control.recv() != "cancel":
                pass
        except (EOFError, OSError):
            pass
        loop.call_soon_threadsafe(task.cancel)

    threading.Thread(target=wait, name="core-pipe-control", daemon=True).start()


async def _train(
    job_class: Any, config: TrainingConfig, payload: bytes, sender: Sender, control: Connection
) -> None:
    task = asyncio.current_task()
    assert task is not None
    _listen(control, asyncio.get_running_loop(), task)
    beat = asyncio.create_task(_heartbeat(sender))
    job = None
    try:
        objects = Crossing.unpack(payload)
        job = job_class(training_config(config), callbacks=[Relay(sender)], **objects)
        async with job:
            results = await job.train()
            final = await asyncio.to_thread(
                save_final_weights, job.model, Path(results.run_dir), results.global_step,
                results.epochs_completed,
            )  # fmt: skip
        sender.put(("ended", "completed", (results, str(final))))
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
    job_class: Any, config: TrainingConfig, payload: bytes, control: Connection, out: Connection,
    threads: int,
) -> None:  # fmt: skip
    """The training process's entry point (``job_class`` is the orchestrator's class, passed
    by reference so this module does not import the shell that imports it; ``threads`` its
    share of the service's ``torch.get_num_threads()``)."""
    os.setpgrp()
    os.nice(NICENESS)
    torch.set_num_threads(threads)
    sender = Sender(out)
    try:
        asyncio.run(_train(job_class, config, payload, sender, control))
    finally:
        sender.close()
        out.close()
