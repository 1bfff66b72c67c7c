"""Gradient accumulation: windows of micro-batches, their loss weights, the sync boundary.

One optimizer step consumes a *window* of ``accumulation_steps`` loader batches (the last
window of an epoch may hold fewer), each loader batch possibly split into micro-batches of
at most ``micro_batch_size`` samples. Each micro-batch's mean loss is weighted by its share
of the window's samples (over all ranks), so the accumulated gradient is exactly that of one
batch holding the whole window, the shorter last window included (dividing by
``accumulation_steps`` would under-weight it); ``normalize_by="tokens"`` weights by target
tokens instead (torchtitan's rule). Only the window's last micro-batch synchronises
gradients across ranks (``MicroBatch.is_last``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

import torch

from core.checks import is_int
from core.data.batches import count_samples, count_tokens, split_batch
from core.errors import config_error
from core.flat_keyword import flat

__all__ = (
    "Accumulation",
    "BatchCheck",
    "GradientAccumulationConfig",
    "MicroBatch",
    "SampleWeights",
    "TokenWeights",
    "Window",
)


@dataclass(frozen=True)
class GradientAccumulationConfig:
    """``accumulation_steps`` loader batches per optimizer step.

    ``micro_batch_size`` (optional) splits each loader batch into chunks of at most that
    many samples; the result is the same, the peak memory lower.

    ``normalize_by`` (default ``"samples"``) is what a micro-batch's loss is weighted by:
    its samples, or (``"tokens"``, for a loss that is a mean over target tokens) its target
    tokens not equal to ``ignore_index`` (default -100, ``CrossEntropyLoss``'s). Tokens cost
    one count per micro-batch (on the loader's tensors: no device sync for CPU batches) and,
    under DDP, one all-reduce of the window's count.
    """

    accumulation_steps: int = field(default=1, metadata=flat("accumulation_steps"))
    micro_batch_size: int | None = field(
        default=None, metadata=flat("micro_batch_size", "batch_size")
    )
    normalize_by: Literal["samples", "tokens"] = field(
        default="samples", metadata=flat("normalize_by")
    )
    ignore_index: int = -100

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
        if self.normalize_by not in ("samples", "tokens"):
            raise config_error(
                "normalize_by",
                self.normalize_by,
                ("samples", "tokens"),
                "use 'tokens' when the loss is a mean over (non-padding) target tokens.",
            )
        if not is_int(self.ignore_index):
            raise config_error("ignore_index", self.ignore_index, "an integer (e.g. -100)")


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


class BatchCheck(Protocol):
    """Raises on a batch that is not of a form the step takes (``core.data.batches.check_batch``
    with its epoch)."""

    def __call__(self, batch: Any, *, batch_index: int) -> object: ...


class Counts(Protocol):
    """What a weighting needs from the strategy: the window's count over all ranks."""

    def window_normaliser(
        self, local: float | torch.Tensor, *, exact: bool = False
    ) -> float | torch.Tensor: ...


class SampleWeights:
    """Each micro-batch's loss weighted by its share of the window's samples."""

    def __call__(
        self, micro: list[MicroBatch], window: Window, counts: Counts
    ) -> list[float | torch.Tensor]:
        normaliser = counts.window_normaliser(window.samples)
        return [m.samples / normaliser for m in micro]


class TokenWeights:
    """Each micro-batch's loss weighted by its share of the window's target tokens (all
    ranks), tokens equal to ``ignore_index`` not counted."""

    def __init__(self, ignore_index: int) -> None:
        self.ignore_index = ignore_index

    def __call__(
        self, micro: list[MicroBatch], window: Window, counts: Counts
    ) -> list[float | torch.Tensor]:
        tokens = [count_tokens(m.data, self.ignore_index) for m in micro]
        total = counts.window_normaliser(sum(tokens), exact=True)  # ranks' windows differ
        # An all-padding window (0 tokens everywhere): weights 0 instead of 0 / 0.
        total = total.clamp(min=1e-6) if isinstance(total, torch.Tensor) else max(total, 1e-6)
        return [t / total for t in tokens]


class Accumulation:
    """A run's gradient accumulation: groups batches into windows and splits them into
    weighted micro-batches."""

    def __init__(self, config: GradientAccumulationConfig | None = None) -> None:
        self.config = config or GradientAccumulationConfig()
        self.micro_batch_size: int | None = self.config.micro_batch_size
        self.loss_weights: SampleWeights | TokenWeights = (
            TokenWeights(self.config.ignore_index)
            if self.config.normalize_by == "tokens"
            else SampleWeights()
        )

    @property
    def accumulation_steps(self) -> int:
        return self.config.accumulation_steps

    def windows(
        self, batches: Iterable[Any], check: BatchCheck, start_index: int = 0
    ) -> Iterator[Window]:
        """Group ``batches`` into windows of ``accumulation_steps`` (the last may be short),
        each batch passed to ``check`` with its index first (which raises on a bad one)."""
        steps = self.accumulation_steps
        if steps == 1:  # the common case: a window per batch, no list to fill
            for index, batch in enumerate(batches, start=start_index):
                check(batch, batch_index=index)
                size = count_samples(batch)
                yield Window([batch], [size], index, size)
            return
        pending: list[Any] = []
        sizes: list[int] = []
        first = start_index
        for index, batch in enumerate(batches, start=start_index):
            check(batch, batch_index=index)
            if not pending:
                first = index
            pending.append(batch)
            sizes.append(count_samples(batch))
            if len(pending) == steps:
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
