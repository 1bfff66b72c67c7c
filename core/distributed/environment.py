"""The one place that reads the environment torchrun (``torch.distributed.run``) sets up."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from core.errors import ConfigError

__all__ = (
    "DistributedEnvironment",
    "as_a_torchrun_rank",
    "rendezvous_address",
    "torchrun_variables",
)

_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
_RESTARTS = "TORCHELASTIC_RESTART_COUNT"  # how often torchrun restarted the workers


def _int(environ: Mapping[str, str], name: str) -> int:
    raw = environ[name]
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(
            f"environment variable {name}={raw!r} is invalid; allowed: an integer >= 0. "
            "Fix: let torchrun set it (torchrun --nproc_per_node=N script.py)."
        ) from None
    if value < 0:
        raise ConfigError(f"environment variable {name}={raw!r} is invalid; allowed: >= 0.")
    return value


@dataclass(frozen=True)
class DistributedEnvironment:
    """Rank, sizes and rendezvous address of this process, as torchrun exported them."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None
    restart_count: int = 0
    agent_store: bool = False  # TORCHELASTIC_USE_AGENT_STORE: workers share the agent's store

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str] | None = None
    ) -> DistributedEnvironment | None:
        """None outside torchrun; an error naming what is missing if it is half set."""
        env = os.environ if environ is None else environ
        present = [name for name in _REQUIRED if name in env]
        if not present:
            return None
        missing = [name for name in _REQUIRED if name not in env]
        if missing:
            raise ConfigError(
                f"the torchrun environment is half set: {', '.join(present)} set but "
                f"{', '.join(missing)} missing; allowed: all of {', '.join(_REQUIRED)} or none. "
                "Fix: launch with torchrun, or unset the stray variables."
            )
        world_size = _int(env, "WORLD_SIZE")
        rank = _int(env, "RANK")
        if world_size < 1 or rank >= world_size:
            raise ConfigError(
                f"environment RANK={rank} with WORLD_SIZE={world_size} is invalid; allowed: "
                "0 <= RANK < WORLD_SIZE. Fix: let torchrun set both."
            )
        return cls(
            rank=rank,
            local_rank=_int(env, "LOCAL_RANK"),
            world_size=world_size,
            local_world_size=_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 1,
            master_addr=env.get("MASTER_ADDR"),
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else None,
            restart_count=_int(env, _RESTARTS) if _RESTARTS in env else 0,
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )

    def agent_rendezvous(self) -> tuple[str, int, str] | None:
        """``(host, port, key prefix)`` for joining the agent's store, or None."""
        if not self.agent_store or self.master_addr is None or self.master_port is None:
            return None
        # torchrun reuses its store across restarts: a prefix per attempt keeps a restarted
        # worker from a previous attempt's keys (a dead peer's gloo address among them).
        return self.master_addr, self.master_port, f"core/attempt_{self.restart_count}/"


def rendezvous_address(environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """``(MASTER_ADDR, MASTER_PORT)`` as set, for ``env://`` outside torchrun."""
    env = os.environ if environ is None else environ
    return env.get("MASTER_ADDR"), env.get("MASTER_PORT")


def torchrun_variables(rank: int, world_size: int, address: str, port: int) -> dict[str, str]:
    """The variables torchrun gives rank ``rank`` of ``world_size``, one rank per machine
    (placed by another launcher: a Ray actor per rank)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "MASTER_ADDR": address,
        "MASTER_PORT": str(port),
    }


@contextlib.contextmanager
def as_a_torchrun_rank(variables: Mapping[str, str]) -> Iterator[None]:
    """This process is the rank ``variables`` describe while the block runs."""
    os.environ.update(variables)
    try:
        yield
    finally:
        for name in variables:
            os.environ.pop(name, None)
