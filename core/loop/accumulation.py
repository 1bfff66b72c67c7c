"""Gradient accumulation: windows of micro-batches, their loss weights, the sync boundary.

One optimizer step consumes a *window* of ``accumulation_steps`` loader batches (the last
window of an epoch may hold fewer, and its last batch may be short). Each loader batch may
be split further into micro-batches of at most ``micro_batch_size`` samples (to save memory,
or after an out-of-memory error).

Every micro-batch loss is a mean over its own samples. It is weighted by
``samples_in_micro_batch / samples_in_window`` before backward, so the accumulated gradient
is exactly the gradient of one batch holding all of the window's samples, including the
shorter last window of an epoch (dividing by ``accumulation_steps`` would under-weight it).
A distributed strategy replaces the local sample count by the global one.

Only the window's last micro-batch (``MicroBatch.is_last``) synchronises gradients across
ranks; the step runs the others inside the strategy's ``no_backward_sync`` context (DDP
``no_sync``, FSDP2 ``set_requires_gradient_sync(False)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from core.checks import is_int
from core.errors import config_error
from core.loop.batches import count_samples, split_batch

__all__ = (
    "GradientAccumulation",
    "GradientAccumulationConfig",
    "MicroBatch",
    "Window",
)


@dataclass(frozen=True)
class GradientAccumulationConfig:
    """``accumulation_steps`` loader batches per optimizer step.

    ``micro_batch_size`` (optional) splits each loader batch into chunks of at most that
    many samples; the result is the same, the peak memory lower.
    """

    accumulation_steps: int = 1
    micro_batch_size: int | None = None

    def __post_init__(self) -> None:
        if not (is_int(self.accumulation_steps) and self.accumulation_steps >= 1):
            raise config_error(
                "accumulation_steps",
                self.accumulation_steps,
                "an integer >= 1",
                "use accumulation_steps=1 to step the optimizer after every batch.",
            )
        if self.micro_batch_size is not None and not (
            is_int(self.micro_batch_size) and self.micro_batch_size >= 1
        ):
            raise config_error(
                "micro_batch_size",
                self.micro_batch_size,
                "None or an integer >= 1",
                "leave it None to use each loader batch whole.",
            )


class MicroBatch(NamedTuple):
    """One forward/backward pass (a tuple: cheap to build on every step)."""

    data: Any
    samples: int
    is_last: bool
    """True for the window's last micro-batch: its backward synchronises gradients."""


class Window(NamedTuple):
    """The loader batches of one optimizer step."""

    batches: list[Any]
    sizes: list[int]
    first_batch_index: int
    samples: int


class GradientAccumulation:
    """Groups batches into windows and splits them into weighted micro-batches."""

    def __init__(self, config: GradientAccumulationConfig | None = None) -> None:
        self.config = config or GradientAccumulationConfig()
        self.micro_batch_size: int | None = self.config.micro_batch_size

    @property
    def accumulation_steps(self) -> int:
        return self.config.accumulation_steps

    def windows(self, batches: Iterable[Any], start_index: int = 0) -> Iterator[Window]:
        """Group ``batches`` into windows of ``accumulation_steps`` (the last may be short)."""
        pending: list[Any] = []
        sizes: list[int] = []
        first = start_index
        for index, batch in enumerate(batches, start=start_index):
            if not pending:
                first = index
            pending.append(batch)
            sizes.append(count_samples(batch))
            if len(pending) == self.accumulation_steps:
                yield Window(pending, sizes, first, sum(sizes))
                pending, sizes = [], []
        if pending:
            yield Window(pending, sizes, first, sum(sizes))

    def micro_batches(self, window: Window) -> list[MicroBatch]:
        """The window's micro-batches in order; only the last one has ``is_last``."""
        if self.micro_batch_size is None:  # the common case: one micro-batch per loader batch
            last = len(window.batches) - 1
            return [
                MicroBatch(batch, size, i == last)
                for i, (batch, size) in enumerate(zip(window.batches, window.sizes, strict=True))
            ]
        chunks: list[tuple[Any, int]] = []
        for batch, size in zip(window.batches, window.sizes, strict=True):
            if size <= self.micro_batch_size:
                chunks.append((batch, size))
            else:
                chunks.extend(
                    (c, count_samples(c)) for c in split_batch(batch, self.micro_batch_size)
                )
        last = len(chunks) - 1
        return [MicroBatch(data, n, i == last) for i, (data, n) in enumerate(chunks)]

    def halve_micro_batch(self, largest_batch: int) -> int | None:
        """Halve the micro-batch size (after an out-of-memory error); None at size 1."""
        current = self.micro_batch_size or largest_batch
        if current <= 1:
            return None
        self.micro_batch_size = max(1, current // 2)
        return self.micro_batch_size

    def state_dict(self) -> dict[str, Any]:
        return {"micro_batch_size": self.micro_batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.micro_batch_size = state["micro_batch_size"]
