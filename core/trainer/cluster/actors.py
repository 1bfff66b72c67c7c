"""The actors a service's runs train in: asked of the cluster, waited for (visibly), kept warm
between runs, and leased. Each is detached and named ``core-run-<hex>``; the service renews its
lease every second from a thread (:data:`LEASES`), and an actor nobody renews stops its run and
exits (docs/ray.md). Warm actors: :data:`WARM`, ``ray.keep_warm``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from core.errors import ClusterStartTimeout
from core.ray_config import RayConfig
from core.trainer.cluster.connection import ray_module, remote_actor_class

__all__ = ("ActorRequest", "LEASES", "Leases", "WARM", "WarmActors", "wait_until_ready")

_LEASE_RENEWAL_S = 1.0
_FIRST_PENDING_S = 1.0
_PENDING_EVERY_S = 10.0


@dataclass(frozen=True)
class ActorRequest:
    """What one actor of a run asks of the cluster."""

    num_cpus: float
    num_gpus: float
    runtime_env: str  # JSON: the request is a key of the warm actors
    namespace: str
    service_lease_s: float

    @classmethod
    def of(cls, config: RayConfig) -> ActorRequest:
        return cls(
            num_cpus=float(config.num_cpus),
            num_gpus=float(config.num_gpus),
            runtime_env=json.dumps(config.runtime_env or {}, sort_keys=True),
            namespace=config.namespace,
            service_lease_s=float(config.service_lease_s),
        )

    @property
    def resources(self) -> dict[str, float]:
        return {"CPU": self.num_cpus, "GPU": self.num_gpus}

    def create(self, scheduling: Any = None) -> Any:
        """A new actor (its creation is queued: it exists once its ``ready`` returns)."""
        options: dict[str, Any] = {
            "name": f"core-run-{uuid.uuid4().hex[:12]}",
            "namespace": self.namespace,
            "lifetime": "detached",
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "max_restarts": 0,
        }
        if self.runtime_env != "{}":
            options["runtime_env"] = json.loads(self.runtime_env)
        if scheduling is not None:
            options["scheduling_strategy"] = scheduling
        threads = max(1, int(self.num_cpus))
        return remote_actor_class().options(**options).remote(self.service_lease_s, threads)


class Leases:
    """Renews every held actor's lease each second, from a thread of its own (so a busy or
    blocked event loop never lets a healthy service's runs go)."""

    def __init__(self) -> None:
        self._held: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, actor: Any) -> None:
        with self._lock:
            self._held[id(actor)] = actor
            if self._thread is None:
                self._thread = threading.Thread(target=self._renew, name="core-ray-lease")
                self._thread.daemon = True
                self._thread.start()

    def drop(self, actor: Any) -> None:
        with self._lock:
            self._held.pop(id(actor), None)

    def _renew(self) -> None:
        while True:
            time.sleep(_LEASE_RENEWAL_S)
            with self._lock:
                actors = list(self._held.values())
            if actors and not ray_module().is_initialized():
                continue  # the service shut Ray down: a call would connect it again
            for actor in actors:
                with contextlib.suppress(Exception):  # gone, or Ray shut down: nothing to renew
                    actor.renew.remote()


LEASES = Leases()


class WarmActors:
    """Idle actors of this service whose run completed, by what they were asked for."""

    def __init__(self) -> None:
        self._idle: dict[ActorRequest, list[Any]] = {}
        self._lock = threading.Lock()
        self._released_at_exit = False

    def take(self, request: ActorRequest) -> Any | None:
        with self._lock:
            idle = self._idle.get(request)
            return idle.pop() if idle else None

    def keep(self, request: ActorRequest, actor: Any) -> None:
        with self._lock:
            self._idle.setdefault(request, []).append(actor)
            if not self._released_at_exit:  # registered after ray.init: runs before its shutdown
                atexit.register(self.release_all)
                self._released_at_exit = True

    def release_all(self) -> None:
        """Retire every idle actor: each exits once its reports are written (at exit, where
        they would otherwise wait out their lease; or when a run waits for what they hold)."""
        with self._lock:
            idle = [actor for actors in self._idle.values() for actor in actors]
            self._idle.clear()
        ray = ray_module()
        for actor in idle:
            LEASES.drop(actor)
            if ray.is_initialized():  # else the cluster is gone, or its lease ends them
                with contextlib.suppress(Exception):
                    actor.retire.remote()


WARM = WarmActors()


async def wait_until_ready(
    ready: list[Any],
    asked: dict[str, float],
    timeout_s: float | None,
    cancelled: anyio.Event,
    pending: Callable[[dict[str, Any]], None],
) -> bool:
    """Wait for the ``ready`` references (an actor's first call, a placement group's
    readiness); ``pending`` gets a record's fields after a second, then every ten, while
    they are not. False when ``cancelled`` first; raises :class:`ClusterStartTimeout` past
    ``timeout_s``."""
    ray = ray_module()
    started = time.monotonic()
    next_pending = _FIRST_PENDING_S
    while not cancelled.is_set():
        done, _ = await anyio.to_thread.run_sync(
            lambda: ray.wait(ready, num_returns=len(ready), timeout=0.25)
        )
        if len(done) == len(ready):
            await anyio.to_thread.run_sync(ray.get, ready)  # raises where creation failed
            return True
        waited = time.monotonic() - started
        if timeout_s is not None and waited > timeout_s:
            total, free = await anyio.to_thread.run_sync(_cluster_resources)
            raise ClusterStartTimeout(asked, timeout_s, total=total, free=free)
        if waited >= next_pending:
            next_pending += _PENDING_EVERY_S
            total, free = await anyio.to_thread.run_sync(_cluster_resources)
            short = any(amount > free.get(name, 0.0) for name, amount in asked.items())
            pending(
                {
                    "waiting_for": "resources" if short else "its actor to start",
                    "asked": asked,
                    "free": free,
                    "total": total,
                    "waited_s": round(waited, 3),
                    "start_timeout_s": timeout_s,
                }
            )
    return False


def _cluster_resources() -> tuple[dict[str, float], dict[str, float]]:
    """The cluster's CPUs and GPUs: in all, and free now."""
    ray = ray_module()

    def shown(resources: dict[str, Any]) -> dict[str, float]:
        return {name: float(resources.get(name, 0.0)) for name in ("CPU", "GPU")}

    return shown(ray.cluster_resources()), shown(ray.available_resources())
