"""Language-model metrics: ``Perplexity``, the exponential of the mean token cross-entropy,
accumulated as a total and a token count on the device."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn import functional as F
from typing_extensions import override

from core.checks import check_bool, is_int
from core.data.batches import describe
from core.errors import config_error
from core.metrics.base import Metric

__all__ = ("Perplexity",)


class Perplexity(Metric):
    """``exp`` of the mean cross-entropy per counted token.

    Logits carry the vocabulary in the last dimension, ``(B, T, V)`` against labels
    ``(B, T)`` (or ``(N, V)`` against ``(N,)``). Labels equal to ``ignore_index`` are not
    counted. ``shift=True`` scores the logits at position t against the label at t + 1, as
    Hugging Face causal LMs do with unshifted ``labels``; leave it False where the targets
    are already the next tokens (nanoGPT's ``(x, y)`` pairs). The cross-entropy is computed
    in float32 whatever the logits' dtype.

    >>> perplexity = Perplexity()
    >>> perplexity.update(torch.zeros(1, 3, 4), torch.tensor([[0, 3, -100]]))
    >>> round(perplexity.compute(perplexity.state()), 6)  # uniform over 4 tokens
    4.0
    """

    def __init__(self, ignore_index: int = -100, shift: bool = False) -> None:
        if not is_int(ignore_index):
            raise config_error(
                "ignore_index",
                ignore_index,
                "an int (the label of padding tokens)",
                "e.g. Perplexity(ignore_index=-100).",
            )
        check_bool("shift", shift)
        super().__init__(size=2)  # [sum of token cross-entropies, counted tokens]
        self.ignore_index = ignore_index
        self.shift = shift

    @override
    def update(self, outputs: Any, targets: Any) -> None:
        if not (
            isinstance(outputs, torch.Tensor)
            and isinstance(targets, torch.Tensor)
            and outputs.is_floating_point()
            and not (targets.is_floating_point() or targets.is_complex())
            and targets.dtype != torch.bool
            and targets.ndim >= (2 if self.shift else 1)
            and outputs.shape[:-1] == targets.shape
        ):
            raise ValueError(
                f"{self!r} got logits {describe(outputs)} and labels {describe(targets)}; "
                "allowed: logits (B, T, V) with the vocabulary last and integer labels "
                "(B, T) (or (N, V) and (N,) without shift). Fix: return logits with the "
                "vocabulary last (move it with logits.transpose(1, 2)), or labels.long()."
            )
        if self.shift:
            outputs, targets = outputs[..., :-1, :], targets[..., 1:]
        logits = outputs.float()  # also makes a shifted view contiguous: one copy at most
        total = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=self.ignore_index,
            reduction="sum",
        )
        counted = (targets != self.ignore_index).sum()
        self.add(torch.stack([total.double(), counted.double()]))

    @override
    def compute(self, state: torch.Tensor) -> float | None:
        total, counted = state.tolist()
        if not counted:
            return None
        try:
            return math.exp(total / counted)
        except OverflowError:
            return math.inf

    @override
    def __repr__(self) -> str:
        return f"Perplexity(ignore_index={self.ignore_index!r}, shift={self.shift!r})"
