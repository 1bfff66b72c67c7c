"""What every placement of a run outside the service's own threads shares (a training
process today; a Ray actor next): how a cancelled ``train()`` reaches it, and how its stop
escalates.

A placement's ``train()`` is one *lifecycle*: a coroutine that opens its resources (the
process, its pidfd, pipes, shared memory, a lock, an actor) in one place, trains, and
releases them in one ``finally``. :func:`until_released` runs it in a task that no
cancellation reaches: whatever cancels ``train()`` (an anyio scope, ``task.cancel()``,
``asyncio.wait_for``, ``asyncio.timeout``, Ctrl-C under ``asyncio.run``, once or again) only
sets the lifecycle's ``cancelled`` event, and propagates once the lifecycle has returned.
So a cancellation can never land between two of its awaits: before the start, the training
is never started; after it, the training is told to stop (:func:`escalate`: asked to
cancel, killed once silent for ``stop_grace_s``) and waited for; either way everything
opened is released before the caller sees the cancellation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import anyio

__all__ = ("Stoppable", "escalate", "kill_if_silent", "until_released")

R = TypeVar("R")


async def until_released(lifecycle: Callable[[anyio.Event], Awaitable[R | None]]) -> R:
    """Run ``lifecycle(cancelled)`` to its end and return its result; a cancellation of the
    caller sets ``cancelled`` and is re-raised once the lifecycle has returned (its result
    or error is then dropped: the caller asked to cancel). The lifecycle returns None only
    when ``cancelled`` was set."""
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
        """Tell the training to cancel: stop at a step boundary, write its stop checkpoint,
        end. False when it cannot be told (it is gone)."""
        ...

    def silent_s(self) -> float:
        """Seconds since it was last heard from (it sends a heartbeat every second)."""
        ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None:
        """End it now (its work since its last checkpoint is lost)."""
        ...


async def escalate(training: Stoppable, grace_s: float) -> str:
    """Ask ``training`` to cancel, then kill it once it has sent nothing for ``grace_s``
    (frozen: a stuck step alone is the training's own stop's to give up on); returns why it
    was killed, or '' when it ended by itself."""
    if not training.ask_to_cancel():
        return ""
    return await kill_if_silent(training, grace_s)


async def kill_if_silent(training: Stoppable, grace_s: float) -> str:
    """Kill ``training`` once it has sent nothing for ``grace_s`` (see :func:`escalate`);
    returns why it was killed, or '' when it ended by itself."""
    while training.is_alive():
        silent = training.silent_s()
        if silent > grace_s:
            training.kill()
            return f" after it sent nothing for stop_grace_s ({grace_s:g} s)"
        await anyio.sleep(min(1.0, grace_s - silent + 0.05))
    return ""
