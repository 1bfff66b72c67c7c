"""One ``train()`` on a Ray cluster (``run.isolation="ray"``), relayed to the service's loop.

The run trains in an actor as it would in a training process: the same crossing rules, records
in order and in batches to the job's event hub, ``request_stop`` forwarded. Connecting,
serializing, waiting for Ray and loading the weights run in worker threads. How each ending
reaches the caller (and :class:`~core.errors.ClusterStartTimeout`): docs/ray.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog
from torch import nn

from core.config import TrainingConfig
from core.errors import TrainingProcessDied
from core.telemetry.events import EventHub
from core.telemetry.run_log import record_before_the_run
from core.trainer.cluster.actors import LEASES, WARM, ActorRequest, wait_until_ready
from core.trainer.cluster.connection import connect, ray_module
from core.trainer.cluster.gang import Gang
from core.trainer.cluster.storage import not_shared, remove_markers, write_markers
from core.trainer.process.child_state import ChildState
from core.trainer.process.crossing import Crossing
from core.trainer.process.pipe import Message
from core.trainer.process.postmortem import last_good_checkpoint
from core.trainer.process.shared import Portable
from core.trainer.running.observers import Observers
from core.trainer.running.placement import escalate, until_released
from core.trainer.running.starts import run_starts
from core.trainer.state.results import TrainingResults

__all__ = ("RayRun",)

_log = structlog.get_logger("core")


class RayRun:
    """Runs one job's ``train()`` on a Ray cluster and relays it to this event loop."""

    def __init__(
        self,
        job_class: type,
        config: TrainingConfig,
        crossing: Crossing,
        *,
        model: nn.Module,
        hub: EventHub,
        observers: Observers,
        state: ChildState,
        on_open: Callable[[Path], None],
    ) -> None:
        self.job_class, self.config, self.crossing = job_class, config, crossing
        self.model, self.hub, self.observers, self.state = model, hub, observers, state
        self.on_open = on_open
        self.request = ActorRequest.of(config.ray)
        self.ended: dict[int, Message] = {}
        """Each rank's ``("ended", how, detail)``."""
        self.lost: dict[int, BaseException | None] = {}
        """The ranks whose stream ended without it (the exception Ray raised, if any)."""
        self.gang: Gang | None = None
        self.held_stop: str | None = None
        self.killed_why = ""
        self.cancelled: anyio.Event | None = None

    @staticmethod
    def prepare(config: TrainingConfig) -> None:
        """Before the first run: connect to the cluster (a worker thread's call)."""
        connect(config.ray)

    async def execute(self) -> TrainingResults:
        """Place the run, relay it to its end, and return or raise as it ended (cancelled,
        however and whenever: see ``core.trainer.running.placement``)."""
        return await until_released(self._lifecycle)

    def request_stop(self, reason: str) -> bool:
        """The job's ``request_stop`` for a run on the cluster: passed on, or held until its
        actors exist. False once the run has ended or is being cancelled."""
        if self.ended or self.lost or (self.cancelled is not None and self.cancelled.is_set()):
            return False
        if self.held_stop is None:
            self.held_stop = str(reason)
            if self.gang is not None:
                self.gang.request_stop(self.held_stop)
        return True

    async def _lifecycle(self, cancelled: anyio.Event) -> TrainingResults | None:
        self.cancelled = cancelled
        opened = contextlib.ExitStack()
        self.hub.reopen()
        failed: list[Exception] = []
        try:
            async with anyio.create_task_group() as watchers:
                self.observers.start(watchers, self.hub)
                try:
                    results = await self._train(cancelled, opened)
                except Exception as exc:  # raised below, not wrapped in the watchers' group
                    failed.append(exc)
                finally:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(opened.close)
                        await self.observers.catch_up()
                        self.hub.close()
                        await self.observers.finish()
        finally:
            opened.close()  # a no-op unless the worker thread above could not run
        if failed:
            raise failed[0]
        return results

    async def _train(
        self, cancelled: anyio.Event, opened: contextlib.ExitStack
    ) -> TrainingResults | None:
        await anyio.to_thread.run_sync(connect, self.config.ray, limiter=run_starts())
        if cancelled.is_set():
            return None
        markers = await anyio.to_thread.run_sync(write_markers, self.config)
        opened.callback(remove_markers, markers)
        gang = await self._place(cancelled, opened)
        if gang is None:
            return None
        unseen = await anyio.to_thread.run_sync(gang.read_markers, markers)
        if unseen is not None:
            raise not_shared(unseen[1], unseen[0])
        if cancelled.is_set():
            return None
        await anyio.to_thread.run_sync(
            gang.start, self.job_class, self.config, self.crossing, limiter=run_starts()
        )
        self.gang = gang
        if self.held_stop is not None:
            gang.request_stop(self.held_stop)
        await self._relay_to_the_end(gang, cancelled)
        if cancelled.is_set():
            return None
        return await self._outcome(gang)

    # -- placing ---------------------------------------------------------------------------
    async def _place(self, cancelled: anyio.Event, opened: contextlib.ExitStack) -> Gang | None:
        """The run's actors, ready (None once ``cancelled``): a warm one, or new ones
        (pending records while Ray queues them); each released by ``opened``."""
        actors = self.config.ray.actors
        warm = WARM.take(self.request) if actors == 1 and self.config.ray.keep_warm else None
        if warm is not None:
            if await self._answers(warm):
                opened.callback(self._release, warm)
                return await self._hosts(Gang([warm]))
            LEASES.drop(warm)  # gone with its node, or its lease: a new one is made
        scheduling: list[Any] = [None]
        if actors > 1:
            group = await anyio.to_thread.run_sync(self._placement_group)
            opened.callback(ray_module().util.remove_placement_group, group)
            if not await self._ready([group.ready()], cancelled):
                return None
            scheduling = [_in_bundle(group, index) for index in range(actors)]
        made = await anyio.to_thread.run_sync(self._create, scheduling)  # Ray imports lazily
        for actor in made:
            LEASES.hold(actor)
            opened.callback(self._release, actor)
        if not await self._ready([actor.ready.remote() for actor in made], cancelled):
            return None
        return await self._hosts(Gang(made))

    def _create(self, scheduling: list[Any]) -> list[Any]:
        return [self.request.create(strategy) for strategy in scheduling]

    async def _ready(self, references: list[Any], cancelled: anyio.Event) -> bool:
        """Wait for the ``references`` (the actors' ``ready`` calls, or a placement group's
        readiness) with pending records; False once ``cancelled``."""
        config = self.config.ray
        return await wait_until_ready(
            references, self.request.resources, config.start_timeout_s, cancelled, self._pending
        )

    async def _answers(self, warm: Any) -> bool:
        """Whether a warm actor still answers (its node may be gone)."""
        ray = ray_module()
        try:
            await anyio.to_thread.run_sync(lambda: ray.get(warm.ready.remote(), timeout=5.0))
        except Exception:
            return False
        return True

    async def _hosts(self, gang: Gang) -> Gang:
        ray = ray_module()
        where = await anyio.to_thread.run_sync(
            ray.get, [actor.ready.remote() for actor in gang.actors]
        )
        gang.hosts = [str(place["host"]) for place in where]
        gang.nodes = [str(place["node_id"]) for place in where]
        return gang

    def _placement_group(self) -> Any:
        config = self.config.ray
        bundles = [{k: v for k, v in self.request.resources.items() if v}] * config.actors
        return ray_module().util.placement_group(bundles, strategy=config.placement_strategy)

    def _pending(self, fields: dict[str, Any]) -> None:
        if fields["waiting_for"] == "resources":  # this service's idle actors may hold them
            WARM.release_all()
        record = record_before_the_run("pending", **fields)
        self.hub.publish(record)
        self.hub.wake_all()
        _log.info("pending", **fields)

    def _release(self, actor: Any) -> None:
        """After the run: an actor whose run completed is kept warm (``keep_warm``); one
        whose run ended otherwise by itself retires (it exits once its reports are written);
        any other (pending, frozen, lost) is killed, and a pending one leaves Ray's queue."""
        ended = len(self.ended) == len(self.gang.actors) if self.gang is not None else False
        completed = ended and all(message[1] == "completed" for message in self.ended.values())
        if completed and self.config.ray.keep_warm and self.config.ray.actors == 1:
            WARM.keep(self.request, actor)
            return
        LEASES.drop(actor)
        with contextlib.suppress(Exception):  # gone already: nothing to end
            if ended and not self.killed_why:
                actor.retire.remote()
            else:
                ray_module().kill(actor)

    # -- relaying --------------------------------------------------------------------------
    async def _relay_to_the_end(self, gang: Gang, cancelled: anyio.Event) -> None:
        """Publish rank 0's records until every rank has ended, beside the stop once
        ``cancelled``; a rank lost ends the others at once."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._stop_once, gang, cancelled)
            while gang.running:
                await gang.wait()
                self._dispatch(gang)
                if self.lost and gang.running:  # the others wait for it in collectives
                    await anyio.to_thread.run_sync(gang.kill_now)
            tg.cancel_scope.cancel()

    async def _stop_once(self, gang: Gang, cancelled: anyio.Event) -> None:
        await cancelled.wait()
        if gang.running:
            self.killed_why = await escalate(gang, self.config.run.stop_grace_s)

    def _dispatch(self, gang: Gang) -> None:
        while gang.messages:
            rank, message = gang.messages.popleft()
            kind = message[0]
            if kind == "records" and rank == 0:
                for record in message[1]:
                    self.state.read(record)
                    self.hub.publish(record)
                self.hub.wake_all()
            elif kind == "opened" and rank == 0:
                self.state.run_dir = Path(message[1])
                self.on_open(self.state.run_dir)
            elif kind == "ended":
                self.ended[rank] = message
            elif kind == "eof":
                gang.running.discard(rank)
                if rank not in self.ended:
                    self.lost[rank] = message[1]

    async def _outcome(self, gang: Gang) -> TrainingResults:
        if self.lost:
            last, done = await anyio.to_thread.run_sync(
                last_good_checkpoint, self.config, self.state
            )
            self.state.last_checkpoint = last
            raise TrainingProcessDied(None, None, last, why=self._why_lost(gang), finished=done)
        endings = [self.ended[rank] for rank in sorted(self.ended)]
        failed = [detail for _, how, detail in endings if how == "failed"]
        if failed:
            raise failed[0]
        how, detail = endings[0][1], endings[0][2]
        if how == "cancelled":  # cancelled by its actor (its lease ran out), not this service
            raise TrainingProcessDied(None, None, detail, why=" after a cancel")
        results, weights = detail
        self.state.best_checkpoint = results.best_checkpoint
        if weights is not None:
            await anyio.to_thread.run_sync(_load, self.model, weights)
        assert isinstance(results, TrainingResults)
        return results

    def _why_lost(self, gang: Gang) -> str:
        rank, cause = next(iter(self.lost.items()))
        host = gang.hosts[rank] if rank < len(gang.hosts) else "?"
        what = f"{type(cause).__name__}" if cause is not None else "its stream ended"
        whose = f"rank {rank}'s" if len(gang.actors) > 1 else "its"
        return f": {whose} Ray actor on {host} was lost ({what}){self.killed_why}"


def _load(model: nn.Module, weights: Portable) -> None:
    model.load_state_dict(weights.unpack(read_only=True))  # copied into the model's own


def _in_bundle(group: Any, index: int) -> Any:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=index
    )
