"""``devices=N`` from the Python API: ``train()`` starts the job's N ranks itself.

The supervised training process is the launcher (:func:`main`): it starts N ranks as
``torchrun --standalone`` would and relays rank 0's records with its own heartbeat.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import pickle
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Mapping
from multiprocessing import get_context
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from core.config import TrainingConfig
from core.distributed.devices import ranks_to_start
from core.distributed.launch import launch_local_ranks, quiet_agent
from core.errors import SignalReceived, TrainingProcessDied
from core.trainer.process import child
from core.trainer.process.child_state import ChildState
from core.trainer.process.crossing import Crossing, exit_if_importing_main
from core.trainer.process.pipe import Message, Sender, until_cancelled
from core.trainer.process.postmortem import last_good_checkpoint
from core.trainer.process.rank import CANCEL, STOP_MARGIN_S, rank_main
from core.trainer.process.shared import Packed

__all__ = ("entry_point", "main", "ranks_crossing")

_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def ranks_crossing(config: TrainingConfig, given: Mapping[str, Any]) -> Crossing | None:
    """The crossing of a job whose ``train()`` starts ``devices=N`` ranks, its names checked;
    None where this process trains the job itself (no ``devices``, 1, or a rank already)."""
    devices = ranks_to_start(config.distributed, isolation=config.run.isolation)
    if devices is None:
        return None
    exit_if_importing_main()
    crossing = Crossing(
        given,
        f"the training process (devices={devices}: each rank rebuilds it)",
        f"run it under torchrun --nproc-per-node {devices}",
    )
    crossing.check_names()
    return crossing


def entry_point(config: TrainingConfig) -> Callable[..., None]:
    """What the training process runs: the job (``child.main``), or the launcher of its
    ``devices=N`` ranks (:func:`main`)."""
    return main if (config.distributed.devices or 1) > 1 else child.main


def main(
    job_class: Any,
    config: TrainingConfig,
    packed: Packed,
    control: Connection,
    out: Connection,
    threads: int,
) -> None:
    """The launcher's entry point (``threads`` is unused: the ranks take torchrun's
    ``OMP_NUM_THREADS=1`` unless it is set)."""
    os.setpgrp()
    os.nice(child.NICENESS)
    for stop in _STOPS:  # until torch's agent installs its own handlers: the same effect
        signal.signal(stop, _raise_signal)
    sender, done, cancelled = Sender(out), threading.Event(), threading.Event()
    records_in, records_out = get_context("spawn").Pipe(duplex=False)
    stops_in, stops_out = get_context("spawn").Pipe(duplex=False)  # requests, to rank 0
    os.register_at_fork(
        after_in_child=functools.partial(_let_go, control, out, records_in, stops_out)
    )
    errors = Path(tempfile.mkdtemp(prefix="core-ranks-"))
    state = ChildState()  # the run as rank 0's records tell it: whose checkpoints are whose
    forward = threading.Thread(target=_forward, args=(records_in, sender, done, state), daemon=True)
    forward.start()
    threading.Thread(target=_beat, args=(sender, done), daemon=True).start()
    listen = (control, cancelled, done, stops_out)
    threading.Thread(target=_listen, args=listen, daemon=True).start()
    try:
        ended = _launch(
            job_class, config, packed, (records_out, stops_in), errors, (cancelled, state)
        )
    finally:
        for stop in _STOPS:  # a late cancel must not cut the report short
            signal.signal(stop, signal.SIG_IGN)
        done.set()
        forward.join(STOP_MARGIN_S)
    sender.put(ended)
    sender.close()
    out.close()
    shutil.rmtree(errors, ignore_errors=True)


def _launch(
    job_class: Any,
    config: TrainingConfig,
    packed: Packed,
    pipes: tuple[Connection, Connection],
    errors: Path,
    watched: tuple[threading.Event, ChildState],
) -> Message:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    cancelled, state = watched
    devices = int(config.distributed.devices or 1)
    # Torch's agent logs each failure too; here ``train()`` raises what happened.
    quiet_agent(logging.CRITICAL)
    try:
        values = launch_local_ranks(
            devices,
            rank_main,
            (job_class, config, packed, *pipes, str(errors)),
            shutdown_timeout_s=math.ceil(config.run.stop_grace_s) + STOP_MARGIN_S,
        )
        return ("ended", "completed", values[0])
    except SignalException:
        if cancelled.is_set():
            return ("ended", "cancelled", last_good_checkpoint(config, state)[0])
        return ("ended", "failed", _kept(errors, [0]) or RuntimeError("the ranks were stopped"))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        kept = _kept(errors, [rank, *sorted(exc.failures)])
        if kept is not None:
            return ("ended", "failed", kept)
        name = failure.signal_name() if failure.exitcode < 0 else None
        code = None if name else failure.exitcode
        last = last_good_checkpoint(config, state)[0]
        died = TrainingProcessDied(code, name, last, why=f" (rank {rank} of {devices})")
        return ("ended", "failed", died)
    except Exception as exc:  # the launch itself failed (a rendezvous error)
        return ("ended", "failed", exc)


def _let_go(*connections: Connection) -> None:
    """In a rank forked from this launcher: close its copies of the launcher's pipe ends (the
    caller sees end-of-file when the launcher dies, whatever its ranks do)."""
    for connection in connections:
        connection.close()


def _raise_signal(signum: int, frame: object) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    raise SignalException(f"process {os.getpid()} got signal {signum}", signal.Signals(signum))


def _forward(records: Connection, sender: Sender, done: threading.Event, state: ChildState) -> None:
    """Rank 0's batches to the caller (``state`` reads them), until the ranks are gone and the
    pipe is drained."""
    while True:
        if records.poll(0.1):
            try:
                batch: list[Message] = records.recv()
            except (EOFError, OSError):
                return
            for message in batch:
                _read(state, message)
                sender.put(message)
        elif done.is_set():
            return


def _beat(sender: Sender, done: threading.Event) -> None:
    while not done.wait(child.HEARTBEAT_S):
        sender.put(("alive",))


def _listen(
    control: Connection, cancelled: threading.Event, done: threading.Event, stops: Connection
) -> None:
    """A ``"cancel"`` from the caller, or its end, stops the ranks (through torch's agent); a
    ``("stop", reason)`` goes to rank 0, whose stop the others follow at a step boundary."""
    until_cancelled(control, stops.send)
    if not done.is_set():
        cancelled.set()
        os.kill(os.getpid(), CANCEL)


def _kept(errors: Path, ranks: list[int]) -> BaseException | None:
    """The exception the first of ``ranks`` that kept one raised."""
    for rank in ranks:
        path = errors / f"rank{rank}.pickle"
        try:
            error = pickle.loads(path.read_bytes())
        except Exception:
            continue
        if isinstance(error, SignalReceived):  # a stop, not a bug: the rank's traceback goes
            vars(error).pop("__notes__", None)
        if isinstance(error, BaseException):
            return error
    return None


def _read(state: ChildState, message: Message) -> None:
    if message[0] == "records":
        for record in message[1]:
            state.read(record)
    elif message[0] == "opened":
        state.run_dir = Path(message[1])
