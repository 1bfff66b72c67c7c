"""A run's actors as its service reaches them: one actor, or ``ray.actors=N`` in a placement
group, one rank each. Each actor's stream is read by a thread into one inbox tagged with the
rank; asked to cancel, every rank is, and silent ranks are killed (``ray.cancel``, then
``ray.kill``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from core.config import TrainingConfig
from core.distributed.environment import torchrun_variables
from core.trainer.cluster.connection import ray_module
from core.trainer.process.crossing import Crossing
from core.trainer.process.pipe import Message
from core.trainer.process.shared import portable

__all__ = ("CANCEL_GRACE_S", "Gang")

CANCEL_GRACE_S = 5.0
"""How long a rank whose stream was cancelled has to end before its actor is killed."""


class Gang:
    """The actors of one run (rank order), their streams and what they said."""

    def __init__(self, actors: list[Any]) -> None:
        self.actors = actors
        self.hosts: list[str] = []
        """Each actor's host, once ready."""
        self.nodes: list[str] = []
        """Each actor's Ray node id, once ready."""
        self.messages: deque[tuple[int, Message]] = deque()
        self.last_heard = [time.monotonic()] * len(actors)
        self.streams: list[Any] = []
        self.running = set(range(len(actors)))
        """The ranks whose stream has not ended."""
        self._token = anyio.lowlevel.current_token()
        self._arrived = anyio.Event()

    # -- starting (worker threads) ---------------------------------------------------------
    def read_markers(self, markers: Mapping[str, str]) -> tuple[str, list[str]] | None:
        """The first actor's host and the markers it does not see; None where all see all."""
        ray = ray_module()
        unseen = ray.get([actor.read_markers.remote(markers) for actor in self.actors])
        for host, missing in zip(self.hosts, unseen, strict=True):
            if missing:
                return host, missing
        return None

    def start(self, job_class: type, config: TrainingConfig, crossing: Crossing) -> None:
        """Start every rank's run and a thread reading its stream (a worker thread's call:
        the job's objects are serialized here)."""
        ray = ray_module()
        environments: list[dict[str, str]] = [{}]
        if len(self.actors) > 1:
            address = ray.get(self.actors[0].ready.remote())["ip"]
            port = ray.get(self.actors[0].free_port.remote())
            world = len(self.actors)
            environments = [torchrun_variables(r, world, address, port) for r in range(world)]
        objects = {**crossing.objects, **crossing.names}
        shared = ray.put(portable(objects))  # once for every rank; tensors beside the pickle
        for rank, (actor, environment) in enumerate(zip(self.actors, environments, strict=True)):
            stream = actor.train.remote(job_class, config, shared, environment)
            self.streams.append(stream)
            reader = threading.Thread(
                target=self._read, args=(rank, stream), name=f"core-ray-reader-{rank}"
            )
            reader.daemon = True
            reader.start()

    # -- hearing ---------------------------------------------------------------------------
    async def wait(self) -> None:
        """Until something arrived since the last wait (at once if it already has)."""
        await self._arrived.wait()
        self._arrived = anyio.Event()

    def _read(self, rank: int, stream: Any) -> None:
        ray = ray_module()
        ending: Message = ("eof", None)
        try:
            for reference in stream:
                self._deliver(rank, ray.get(reference))
        except Exception as exc:  # the actor, its node or its stream is gone
            ending = ("eof", exc)
        self._deliver(rank, [ending])

    def _deliver(self, rank: int, batch: list[Message]) -> None:
        self.messages.extend((rank, message) for message in batch)
        self.last_heard[rank] = time.monotonic()
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody is left to read
            anyio.from_thread.run_sync(self._arrived.set, token=self._token)

    # -- Stoppable -------------------------------------------------------------------------
    def ask_to_cancel(self) -> bool:
        for rank in self.running:
            self.actors[rank].cancel.remote()
        return bool(self.running)

    def request_stop(self, reason: str) -> None:
        for actor in self.actors:
            actor.request_stop.remote(reason)

    def silent_s(self) -> float:
        now = time.monotonic()
        return max((now - self.last_heard[rank] for rank in self.running), default=0.0)

    def is_alive(self) -> bool:
        return bool(self.running)

    def kill(self) -> None:
        """``ray.cancel`` every running rank's stream (its run is cancelled as the stream
        goes), and ``ray.kill`` the actors of those still running :data:`CANCEL_GRACE_S`
        later (an event loop that does not even send its heartbeat may not see a cancel)."""
        ray = ray_module()
        for rank in list(self.running):
            with contextlib.suppress(Exception):  # ended meanwhile
                ray.cancel(self.streams[rank])
        killer = threading.Timer(CANCEL_GRACE_S, self.kill_now)
        killer.daemon = True
        killer.start()

    def kill_now(self) -> None:
        """``ray.kill`` the actors of the ranks still running."""
        ray = ray_module()
        for rank in list(self.running):
            with contextlib.suppress(Exception):  # gone already
                ray.kill(self.actors[rank])
