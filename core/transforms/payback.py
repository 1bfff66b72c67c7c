"""``compile="auto"``: compile only when the run is long enough to repay the compilation.
On CUDA it times eager steps, then compiles when ``remaining_steps x eager_step_s x
EXPECTED_SAVING >= EXPECTED_COMPILE_S``, with one ``compile_decision`` record; never on CPU,
under FSDP2, or when the run's length is unknown.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

__all__ = (
    "CompileWhenItPays",
    "EXPECTED_COMPILE_S",
    "EXPECTED_SAVING",
    "payback_rule",
    "planned_steps",
)

# Measured: compiling took 24 s for a 137K-parameter model on an H100, 40-47 s for small
# models on a CPU, and saved 5-15% of a GPT-2-small-shaped step on an H100, about nothing on
# a CPU. With these two, the rest of the run must take >= 10 minutes eagerly.
EXPECTED_SAVING = 0.10
"""The fraction of an eager step a compiled step is expected to save."""
EXPECTED_COMPILE_S = 60.0
"""The seconds a compilation is expected to take (forward and backward graphs)."""

Emit = Callable[..., None]


def planned_steps(
    batches_per_epoch: int | None, accumulation_steps: int, max_epochs: int, max_steps: int | None
) -> int | None:
    """Optimizer steps the whole run plans (``max_steps`` caps it); None when unknown (a
    streamed loader without ``max_steps``)."""
    if batches_per_epoch is None:
        return max_steps
    total = -(-batches_per_epoch // accumulation_steps) * max_epochs
    return total if max_steps is None else min(total, max_steps)


def payback_rule() -> str:
    """The rule, as ``run_start`` and the ``compile_decision`` record state it."""
    return (
        f"compile when remaining planned steps x measured eager step time x "
        f"{EXPECTED_SAVING:.0%} saved >= {EXPECTED_COMPILE_S:.0f} s of compilation"
    )


class CompileWhenItPays:
    """A step hook: times eager steps, then decides once whether to compile the model."""

    def __init__(
        self,
        *,
        planned_steps: int,
        compile_now: Callable[[], list[str]],
        emit: Emit,
        warmup_steps: int = 5,
        measure_steps: int = 20,
        clock: Callable[[], float] = perf_counter,
    ) -> None:
        self.planned_steps = planned_steps
        self.compile_now = compile_now
        self.emit = emit
        self.warmup_steps = warmup_steps
        self.measure_steps = measure_steps
        self.clock = clock
        self.decision: dict[str, Any] | None = None
        self._started: float | None = None
        self._first: int | None = None

    def next_due(self, step: int) -> int | None:
        """The steps it is called after (``core.loop.schedule``): the first one it sees, the
        ends of the warm-up and of the measured steps, and the run's planned last step."""
        if self.decision is not None:
            return None
        if self._first is None:
            return step + 1
        warm = self._first + self.warmup_steps - 1
        marks = (warm, warm + self.measure_steps, self.planned_steps)
        return min((mark for mark in marks if mark > step), default=step + 1)

    def __call__(self, step: int) -> None:
        if self.decision is not None:
            return
        if self._first is None:  # the run's first step here (it may resume mid-run)
            self._first = step
        warm = self._first + self.warmup_steps - 1
        if step == warm:
            self._started = self.clock()
        elif self._started is not None and step == warm + self.measure_steps:
            self._decide(step, (self.clock() - self._started) / self.measure_steps)
        elif step >= self.planned_steps:  # the run ends before anything was measured
            self._decide(step, None)

    def _decide(self, step: int, eager_step_s: float | None) -> None:
        remaining = max(0, self.planned_steps - step)
        saving = None if eager_step_s is None else remaining * eager_step_s * EXPECTED_SAVING
        pays = saving is not None and saving >= EXPECTED_COMPILE_S
        self.decision = {
            "step": step,
            "eager_step_s": eager_step_s,
            "remaining_steps": remaining,
            "expected_saving_s": saving,
            "expected_compile_s": EXPECTED_COMPILE_S,
            "compile": pays,
            "rule": payback_rule(),
            "compiled": self.compile_now() if pays else [],
        }
        self.emit("compile_decision", **self.decision)
