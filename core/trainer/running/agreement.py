"""Ranks that always agree on how a run ended: every rank raises the same error.

After a run closed, each rank publishes how it ended (``core.distributed.outcome``) and reads
every other rank's; a rank that never publishes (stuck in a step) is left out after ``wait_s``.
"""

from __future__ import annotations

import core.errors
from core.distributed import Strategy
from core.distributed.outcome import RankOutcome
from core.errors import CoreError, NonFiniteLossError, SignalReceived

__all__ = ("agree_on_outcome",)


def agree_on_outcome(
    strategy: Strategy,
    failure: BaseException | None,
    last_checkpoint: str | None,
    wait_s: float,
) -> BaseException | None:
    """What this rank raises, now that every rank said how its run ended (``failure`` in
    one process)."""
    if strategy.world_size == 1:
        return failure
    mine = _outcome(strategy.rank, failure, last_checkpoint)
    outcomes = strategy.exchange_outcomes(mine, wait_s)
    failed = [o for o in outcomes if o.error_type not in (None, "SignalReceived")]
    failed_here = isinstance(failure, Exception) and not isinstance(failure, SignalReceived)
    # A rank that did not fail raises the lowest failed rank's error; a non-finite streak
    # (met by every rank at one step, through the all-reduce) raises the same one everywhere.
    if failed and (isinstance(failure, NonFiniteLossError) or not failed_here):
        return _same_error(failed[0], outcomes, failure, last_checkpoint)
    signalled = [o for o in outcomes if o.error_type == "SignalReceived"]
    if signalled and len(signalled) < strategy.world_size:  # a signal some ranks received
        first = signalled[0]
        assert first.signum is not None
        abandoned = isinstance(failure, SignalReceived) and failure.abandoned
        agreed = SignalReceived(first.signum, last_checkpoint, abandoned=abandoned, rank=first.rank)
        return _chained(agreed, failure)
    return failure


def _outcome(rank: int, failure: BaseException | None, last: str | None) -> RankOutcome:
    if not isinstance(failure, Exception):  # completed, or cancelled by this rank's caller
        return RankOutcome(rank=rank, last_checkpoint=last)
    return RankOutcome(
        rank=rank,
        error_type=type(failure).__name__,
        message=str(failure),
        signum=failure.signum if isinstance(failure, SignalReceived) else None,
        own_loss_nonfinite=isinstance(failure, NonFiniteLossError) and failure.own_loss_nonfinite,
        last_checkpoint=last,
    )


def _same_error(
    first: RankOutcome,
    outcomes: list[RankOutcome],
    failure: BaseException | None,
    last: str | None,
) -> BaseException:
    kept = f" Last good checkpoint: {last}." if last else " No checkpoint was written yet."
    if first.error_type == NonFiniteLossError.__name__:
        culprits = tuple(o.rank for o in outcomes if o.own_loss_nonfinite)
        where = (
            f"the loss was not finite on rank {', '.join(map(str, culprits))} (the other "
            "ranks' gradients were, through the all-reduce)"
            if culprits
            else "the gradients were not finite on every rank"
        )
        nonfinite = NonFiniteLossError(f"{where}: {first.message}{kept}")
        nonfinite.ranks = culprits
        nonfinite.rank = culprits[0] if culprits else first.rank
        return _chained(nonfinite, failure)
    kind = getattr(core.errors, first.error_type or "", None)
    if not (isinstance(kind, type) and issubclass(kind, CoreError)) or kind is SignalReceived:
        kind = CoreError
    said = f"rank {first.rank} failed ({first.error_type}): {first.message}{kept}"
    agreed: CoreError = kind(said)
    agreed.rank = first.rank
    return _chained(agreed, failure)


def _chained(agreed: BaseException, failure: BaseException | None) -> BaseException:
    agreed.__cause__ = failure if isinstance(failure, Exception) else None
    return agreed
