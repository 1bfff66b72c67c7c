"""How each rank's run ended, exchanged through the job's key-value store. A store, unlike a
collective, cannot be matched against one a stuck peer is inside; the wait also keeps a rank
that failed first from exiting (torchrun would tear the others down) while they close their run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = ("RankOutcome", "exchange_outcomes")

_exchanges = itertools.count(1)  # this process's exchanges so far


@dataclass(frozen=True)
class RankOutcome:
    """One rank's end of a run: no error, or the error's class, message and details."""

    rank: int
    error_type: str | None = None
    message: str = ""
    signum: int | None = None  # SignalReceived: the signal this rank received
    own_loss_nonfinite: bool = False  # NonFiniteLossError: this rank's own loss was
    last_checkpoint: str | None = None

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, text: bytes | str) -> RankOutcome:
        fields: dict[str, Any] = json.loads(text)
        return cls(**fields)


def exchange_outcomes(
    store: Any, mine: RankOutcome, world_size: int, timeout_s: float
) -> list[RankOutcome]:
    """Publish ``mine``, wait up to ``timeout_s`` for every rank's; the outcomes of the ranks
    that published, in rank order (a stuck rank is missing)."""
    exchange = next(_exchanges)  # every rank ends as many runs, in order
    keys = [f"core/outcome/{exchange}/{rank}" for rank in range(world_size)]
    store.set(keys[mine.rank], mine.encode())
    with contextlib.suppress(Exception):  # a rank that never published: go on without it
        store.wait(keys, timedelta(seconds=timeout_s))
    return [RankOutcome.decode(store.get(k)) for k in keys if store.check([k])]
