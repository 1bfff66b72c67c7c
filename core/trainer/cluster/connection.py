"""The service's connection to its Ray cluster, made once, off the event loop's thread.

Ray is imported here, on demand (it is the optional ``core[ray]`` extra, and importing it
costs about a second): a job with ``run.isolation="ray"`` checks at creation that it can be
imported, and connects where its run starts.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from types import ModuleType
from typing import Any

from core.errors import config_error
from core.ray_config import RayConfig

__all__ = ("connect", "remote_actor_class", "require_ray")

_PRELOAD = "torch,core"
"""What the workers of a cluster started here import before their first task: a new
actor is then ready in about a second instead of importing torch again (6-15 s)."""

_connecting = threading.Lock()


def require_ray() -> None:
    """Raise :class:`~core.errors.ConfigError` unless Ray can be imported."""
    if importlib.util.find_spec("ray") is None:
        raise config_error(
            "run.isolation",
            "ray",
            "'thread' or 'process' (Ray is not installed)",
            "install the extra: pip install 'core[ray]' (or pip install ray).",
        )


def ray_module() -> ModuleType:
    import ray

    return ray


def connect(config: RayConfig) -> None:
    """Connect this process to the cluster ``config.address`` names (a worker thread's call:
    a first connection takes seconds). A program that called ``ray.init`` itself keeps its
    connection; with no address and no cluster to find, Ray starts one here, its workers
    preloading torch and core."""
    ray = ray_module()
    with _connecting:
        if ray.is_initialized():
            return
        starts_here = config.address == "local" or (
            config.address is None and "RAY_ADDRESS" not in os.environ
        )
        if starts_here:  # (None may find a cluster running here: the variable does nothing)
            os.environ.setdefault("RAY_preload_python_modules", _PRELOAD)
        ray.init(address=config.address, namespace=config.namespace, configure_logging=False)


@functools.cache
def remote_actor_class() -> Any:
    """:class:`~core.trainer.cluster.actor.RunActor` as a Ray actor class."""
    from core.trainer.cluster.actor import RunActor

    return ray_module().remote(RunActor)
