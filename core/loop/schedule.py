"""Work that is due after some optimizer steps, called only when it is due.

Validation and checkpoints every N steps, the profiler's window, the compile decision: each
is a *step hook* naming the step it next runs after (:meth:`StepHook.next_due`). The loop
compares its step counter with the earliest of those: one integer comparison on a step
where nothing is due.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

__all__ = ("EveryStep", "StepHook", "StepSchedule", "next_multiple")


@runtime_checkable
class StepHook(Protocol):
    """Work run on the step thread after some optimizer steps."""

    def next_due(self, step: int) -> int | None:
        """The first global step after ``step`` this hook must run after; None: no step."""
        ...

    def __call__(self, step: int) -> None:
        """Run after optimizer step ``step`` (a step :meth:`next_due` named)."""
        ...


class EveryStep:
    """A plain callable of the global step, run after every optimizer step."""

    def __init__(self, hook: Callable[[int], None]) -> None:
        self.hook = hook

    def next_due(self, step: int) -> int | None:
        return step + 1

    def __call__(self, step: int) -> None:
        self.hook(step)


def next_multiple(step: int, *intervals: int | None) -> int | None:
    """The first step after ``step`` that is a multiple of one of ``intervals`` (None ones
    ignored); None when every interval is None."""
    multiples = [(step // every + 1) * every for every in intervals if every is not None]
    return min(multiples, default=None)


class StepSchedule:
    """The step hooks of a loop and the step each one waits for."""

    def __init__(self, hooks: Iterable[StepHook | Callable[[int], None]] = ()) -> None:
        self.hooks: list[StepHook] = []
        self._due: list[int | None] = []
        for hook in hooks:
            self.add(hook)

    def add(self, hook: StepHook | Callable[[int], None]) -> None:
        """Run ``hook`` after the steps it names (a plain callable: after every step), after
        the hooks added before it; counted from the next :meth:`start`."""
        self.hooks.append(hook if isinstance(hook, StepHook) else EveryStep(hook))
        self._due.append(None)

    def start(self, step: int) -> int | None:
        """Ask every hook, at global step ``step`` (an epoch opens), which step it waits for;
        return the earliest (None: no hook waits for any)."""
        self._due = [hook.next_due(step) for hook in self.hooks]
        return min((due for due in self._due if due is not None), default=None)

    def reached(self, step: int) -> int | None:
        """After optimizer step ``step``: run the hooks waiting for it, in order; return the
        earliest step any hook waits for now."""
        for index, hook in enumerate(self.hooks):
            if self._due[index] == step:
                hook(step)
                self._due[index] = hook.next_due(step)
        return min((due for due in self._due if due is not None), default=None)
