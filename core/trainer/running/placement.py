"""What every placement of a run outside the service's own threads shares (a training
process, a Ray actor): how a cancelled ``train()`` reaches it, and how its stop escalates.

A placement's ``train()`` is one *lifecycle*, a coroutine that opens its resources and
releases them in one ``finally``. :func:`until_released` runs it where no cancellation cuts
it short: a cancellation of any kind only sets its ``cancelled`` event, and propagates once
everything it opened is released.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import anyio

__all__ = ("Stoppable", "escalate", "kill_if_silent", "until_released")

R = TypeVar("R")


async def until_released(
    lifecycle: Callable[[anyio.Event], Awaitable[R | None]],
    *,
    dropped: Callable[[R], object] = lambda result: None,
) -> R:
    """Run ``lifecycle(cancelled)`` to its end and return its result (None only once
    ``cancelled``); a cancellation is re-raised after it, dropping its result or error.

    A result dropped that way goes to ``dropped`` first, to let go of what it holds: a
    cancellation can land after the lifecycle last looked at ``cancelled``."""
    cancelled, ended = anyio.Event(), anyio.Event()
    outcome: list[R | None] = []
    failed: list[BaseException] = []

    async def run() -> None:
        try:
            with anyio.CancelScope(shield=True):  # nothing from outside cuts it short
                outcome.append(await lifecycle(cancelled))
        except BaseException as exc:  # raised by the caller's task, after the task group
            failed.append(exc)
        finally:
            ended.set()

    interruption: BaseException | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        while not ended.is_set():
            try:
                # Unshielded until the first cancellation arrives: an anyio scope's reaches
                # this wait; after it, a repeated native cancellation only resumes it.
                with anyio.CancelScope(shield=interruption is not None):
                    await ended.wait()
            except anyio.get_cancelled_exc_class() as exc:
                interruption = interruption or exc
                cancelled.set()
    if interruption is not None:
        if outcome and outcome[0] is not None:
            dropped(outcome[0])
        raise interruption
    if failed:
        raise failed[0]
    result = outcome[0]
    if result is None:  # a lifecycle's bug, not the caller's cancellation
        raise RuntimeError("a placement's lifecycle returned nothing without a cancellation")
    return result


class Stoppable(Protocol):
    """A training running outside the service, as a stop escalates on it."""

    def ask_to_cancel(self) -> bool:
        """Tell it to stop at a step boundary with its checkpoint; False when it is gone."""
        ...

    def silent_s(self) -> float:
        """Seconds since it was last heard from (it sends a heartbeat every second)."""
        ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...


async def escalate(training: Stoppable, grace_s: float) -> str:
    """Ask ``training`` to cancel, then kill it once silent for ``grace_s`` (frozen: a stuck
    step alone is its own stop's to give up on); returns why it was killed, or ''."""
    if not training.ask_to_cancel():
        return ""
    return await kill_if_silent(training, grace_s)


async def kill_if_silent(training: Stoppable, grace_s: float) -> str:
    """Kill ``training`` once silent for ``grace_s``; returns why it was killed, or ''."""
    while training.is_alive():
        silent = training.silent_s()
        if silent > grace_s:
            training.kill()
            return f" after it sent nothing for stop_grace_s ({grace_s:g} s)"
        await anyio.sleep(min(1.0, grace_s - silent + 0.05))
    return ""
