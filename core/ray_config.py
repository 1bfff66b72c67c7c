"""Where a run trains on a Ray cluster (``TrainingConfig.ray``, used by
``run.isolation="ray"``; re-exported by :mod:`core.config` and :mod:`core`)::

    TrainingConfig(
        run=RunConfig(isolation="ray", log_dir="/mnt/shared/logs"),
        ray=RayConfig(address="auto", num_gpus=1),
    )

Nothing here imports Ray: the section is checked without the ``core[ray]`` extra, and a run
that uses it without Ray installed is refused where it is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from core.checks import check_bool_fields, is_finite_number, is_int
from core.errors import config_error

__all__ = ("RayConfig",)

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """How a run is placed on a Ray cluster (``run.isolation="ray"``).

    ``address``: the cluster (``"auto"``: the one this machine is a node of;
    ``"10.0.0.5:6379"``; ``"local"``: a new one, here); None connects to the one
    ``RAY_ADDRESS`` names or that runs on this machine, or starts one here. A cluster
    started here preloads torch and core in its workers. A program that called ``ray.init``
    itself keeps its connection. Ray Client (``ray://``) is refused: its references cannot
    stream a run's records. ``namespace``: the Ray namespace of the run's actors.

    Each run is one actor asking for ``num_cpus`` CPUs and ``num_gpus`` GPUs (a fraction
    shares a GPU); the run's ``distributed.devices=N`` then start N ranks inside it (ask for
    N GPUs). ``actors=N`` places one rank per actor instead, N actors in a placement group
    (``placement_strategy``: ``"SPREAD"`` over nodes where it can, ``"STRICT_SPREAD"``
    always, ``"PACK"`` together), so a run spans machines; each actor asks for
    ``num_cpus``/``num_gpus``. ``runtime_env`` is Ray's (``{"pip": [...],
    "working_dir": ...}``), for every actor of the run.

    A run whose resources are not free waits in Ray's queue (a ``pending`` record says what
    for) at most ``start_timeout_s`` (None: as long as it takes), then fails with an error
    naming what it asked for and what the cluster has. ``keep_warm``: an actor whose run
    completed waits for this service's next run with the same resources (its imports done:
    the next run's first step comes about a second after ``train()``). An actor whose
    service has not been heard from for ``service_lease_s`` (the service died, or its
    machine) stops its run at the next step boundary with its stop checkpoint, then exits.
    """

    address: str | None = None
    namespace: str = "core"
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    actors: int = 1
    placement_strategy: PlacementStrategy = "SPREAD"
    runtime_env: dict[str, Any] | None = None
    start_timeout_s: float | None = 300.0
    keep_warm: bool = True
    service_lease_s: float = 15.0

    def __post_init__(self) -> None:
        if self.address is not None and not (isinstance(self.address, str) and self.address):
            raise config_error(
                "address", self.address, "None or a cluster address", "e.g. address='auto'."
            )
        if isinstance(self.address, str) and self.address.startswith("ray://"):
            raise config_error(
                "address",
                self.address,
                "'auto', 'local' or a head node's 'host:6379' (not Ray Client's ray://: its "
                "references cannot stream a run's records)",
                "join the cluster from the service's machine (ray start --address=HEAD:6379 "
                "--num-cpus=0 --num-gpus=0) and pass address='auto'.",
            )
        if not (isinstance(self.namespace, str) and self.namespace):
            raise config_error("namespace", self.namespace, "a non-empty string")
        for name in ("num_cpus", "num_gpus"):
            amount = getattr(self, name)
            if not (is_finite_number(amount) and amount >= 0):
                raise config_error(name, amount, "a number >= 0", f"e.g. {name}=1.")
        if not (is_int(self.actors) and self.actors >= 1):
            raise config_error("actors", self.actors, "an integer >= 1 (ranks, one per actor)")
        strategies = get_args(PlacementStrategy)
        if self.placement_strategy not in strategies:
            raise config_error(
                "placement_strategy", self.placement_strategy, " or ".join(map(repr, strategies))
            )
        if self.runtime_env is not None and not isinstance(self.runtime_env, dict):
            raise config_error(
                "runtime_env", self.runtime_env, "None or a dict", "e.g. {'pip': ['scikit-learn']}."
            )
        timeout = self.start_timeout_s
        if timeout is not None and not (is_finite_number(timeout) and timeout > 0):
            raise config_error("start_timeout_s", timeout, "None or a number of seconds > 0")
        if not (is_finite_number(self.service_lease_s) and self.service_lease_s >= 2):
            raise config_error("service_lease_s", self.service_lease_s, "a number of seconds >= 2")
        check_bool_fields(self)
