"""A run's home on a Ray cluster: the actor that trains one job at a time, as in thread mode.

Everything the job says crosses back, in order, as the items of one streaming call
(:meth:`RunActor.train`), batched as a training process's pipe batches them
(``core.trainer.process.pipe``); :meth:`RunActor.request_stop` and :meth:`RunActor.cancel` run
beside the stream. An actor whose lease (:meth:`RunActor.renew`) lapses for
``service_lease_s`` cancels its run and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from core.config import TrainingConfig
from core.distributed.environment import as_a_torchrun_rank
from core.reports.apart import wait_for_reports
from core.trainer.process.child import HEARTBEAT_S, Relay
from core.trainer.process.pipe import Message
from core.trainer.process.shared import Portable, portable

__all__ = ("RunActor", "actor_config")

_LEASE_CHECK_S = 1.0
_REPORTS_GRACE_S = 120.0


def actor_config(config: TrainingConfig) -> TrainingConfig:
    """The service's config as the actor trains it: in a step thread of its own, with no
    signal handlers (the actor's event loop is not on its process's main thread) and no
    progress bar (the service's callbacks draw one)."""
    run = replace(config.run, isolation="thread", handle_signals=False)
    return replace(config, run=run, logging=replace(config.logging, progress=False))


class _Outbox:
    """What the run says, waiting for the stream's next item (``put`` from any thread)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._messages: deque[Message] = deque()
        self.arrived = asyncio.Event()

    def put(self, message: Message) -> None:
        self._messages.append(message)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self.arrived.set()
        else:
            self._loop.call_soon_threadsafe(self.arrived.set)

    def take(self) -> list[Message]:
        """Everything said since the last take, records of consecutive messages joined."""
        self.arrived.clear()
        batch: list[Message] = []
        while self._messages:
            message = self._messages.popleft()
            if message[0] == "records" and batch and batch[-1][0] == "records":
                batch[-1] = ("records", [*batch[-1][1], *message[1]])
            else:
                batch.append(message)
        return batch


class RunActor:
    """Trains one job at a time for a service, on a Ray cluster (see the module's text).

    ``service_lease_s``: how long the actor waits for its service to renew its lease;
    ``threads``: ``torch.set_num_threads`` here (the CPUs the actor was given)."""

    def __init__(self, service_lease_s: float, threads: int) -> None:
        torch.set_num_threads(max(1, threads))
        self._lease_s = service_lease_s
        self._renewed = time.monotonic()
        self._watchdog: asyncio.Task[None] | None = None
        self._training: asyncio.Task[None] | None = None
        self._job: Any = None
        self._held_stop: str | None = None
        self._cancelled = False

    async def ready(self) -> dict[str, Any]:
        """Where this actor runs (the service's first call: it returns once the actor exists)."""
        self.renew()
        if self._watchdog is None:
            self._watchdog = asyncio.create_task(self._watch_lease())
        return {"host": socket.gethostname(), "pid": os.getpid(), **_actor()}

    def renew(self) -> None:
        """The service is still there (it calls this every second)."""
        self._renewed = time.monotonic()

    async def read_markers(self, markers: Mapping[str, str]) -> list[str]:
        """The directories (of ``{path: token}``) whose marker this node does not see with
        its token: not the storage the service writes to."""
        return [path for path, token in markers.items() if _read(Path(path)) != token]

    async def free_port(self) -> int:
        """A TCP port free on this actor's node (rank 0's, for its process group)."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            return int(probe.getsockname()[1])

    async def train(
        self,
        job_class: Any,
        config: TrainingConfig,
        objects: Portable,
        environment: Mapping[str, str],
    ) -> AsyncIterator[list[Message]]:
        """Train ``job_class(config, **objects)`` (``environment``: a rank's torchrun
        variables under ``ray.actors=N``), yielding what it says until it has ended."""
        self.renew()
        outbox = _Outbox()
        with as_a_torchrun_rank(environment):
            self._training = asyncio.create_task(self._train(job_class, config, objects, outbox))
            try:
                while True:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(outbox.arrived.wait(), HEARTBEAT_S)
                    batch = outbox.take() or [("alive",)]
                    yield batch
                    if batch[-1][0] == "ended":
                        return
            finally:  # the stream was cancelled (ray.cancel): the run goes with it
                if not self._training.done():
                    self._training.cancel()

    async def retire(self) -> None:
        """Exit once the reports of the runs trained here are written (a report writer is
        this process's child: Ray would kill it with the actor)."""
        with contextlib.suppress(Exception):  # a writer that failed said so in its run dir
            await asyncio.to_thread(wait_for_reports, None, _REPORTS_GRACE_S)
        _exit_actor()

    async def request_stop(self, reason: str) -> None:
        """The job's ``request_stop``, held until the job exists."""
        if self._job is None:
            self._held_stop = self._held_stop or reason
        else:
            self._job.request_stop(reason)

    async def cancel(self) -> None:
        """Cancel the run: its stop checkpoint is written at the next step boundary."""
        self._cancelled = True
        if self._training is not None and not self._training.done():
            self._training.cancel()

    async def _train(
        self, job_class: Any, config: TrainingConfig, crossed: Portable, outbox: _Outbox
    ) -> None:
        job: Any = None
        try:
            if self._cancelled:  # cancelled before the stream began
                raise asyncio.CancelledError
            objects = await asyncio.to_thread(crossed.unpack)
            if self._cancelled:
                raise asyncio.CancelledError
            relay = Relay(outbox)  # type: ignore[arg-type]  # an outbox has the sender's put
            self._job = job = job_class(actor_config(config), callbacks=[relay], **objects)
            relay.follow(job)
            job.isolation = {"mode": "ray", **await self.ready()}
            if self._held_stop is not None:  # runs once train() below has begun
                asyncio.get_running_loop().call_soon(job.request_stop, self._held_stop)
            try:
                results = await job.train()
                weights = await asyncio.to_thread(_trained_weights, job)
            finally:
                await job.aclose()
            outbox.put(("ended", "completed", (results, weights)))
        except asyncio.CancelledError:
            last = job.last_checkpoint if job is not None and job.run_dir is not None else None
            outbox.put(("ended", "cancelled", last))
        except Exception as exc:
            outbox.put(("ended", "failed", exc))
        finally:  # a stop or cancel that came before train() is this run's, not the next's
            self._job, self._held_stop, self._cancelled = None, None, False

    async def _watch_lease(self) -> None:
        """Cancel the run, then exit, once the service has not renewed for the lease."""
        while time.monotonic() - self._renewed <= self._lease_s:
            await asyncio.sleep(_LEASE_CHECK_S)
        training = self._training
        if training is not None and not training.done():
            training.cancel()
            with contextlib.suppress(BaseException):
                await training
            await asyncio.sleep(_LEASE_CHECK_S)  # the stream's last item, to nobody
        os._exit(0)


def _exit_actor() -> None:
    """End this actor as Ray expects one to end itself (no "worker died" in its logs)."""
    import ray.actor  # in Ray's worker: Ray is there

    exit_actor: Callable[[], None] = ray.actor.exit_actor  # untyped in Ray
    exit_actor()


def _trained_weights(job: Any) -> Portable | None:
    """The model's full weights on the CPU, for the service's model (rank 0's; None on the
    other ranks of ``ray.actors=N``), their bytes beside the pickle (``Portable``). Under
    FSDP2 every rank calls it (a collective)."""
    if job.trains_here:
        state = job.distribution.strategy.model_state_dict(job.model)
    else:  # devices=N here: the ranks' weights are in the job's model already
        state = job.model.state_dict()
    if job.rank != 0:
        return None
    return portable({key: value.detach().cpu() for key, value in state.items()})


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _actor() -> dict[str, str]:
    """This actor's name, and its node: its address and Ray's id for it."""
    import ray  # in Ray's worker: Ray is there

    context = ray.get_runtime_context()
    node_address: Callable[[], str] = ray.util.get_node_ip_address  # untyped in Ray
    return {
        "actor": str(context.get_actor_name()),
        "ip": node_address(),
        "node_id": str(context.get_node_id()),
    }
