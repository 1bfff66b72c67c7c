"""Classification metrics over class scores: ``Accuracy`` (top-k) and ``F1Score`` (macro,
micro, binary), accumulated as counts on the device.

Outputs are class scores (logits or probabilities) with one more dimension than the integer
targets: ``(N, C, ...)`` with targets ``(N, ...)`` for ``(inputs, targets)`` batches, as
``nn.CrossEntropyLoss`` reads them, and ``(..., C)`` for dict batches, as Hugging Face models
return them (``class_dim=None`` follows the batch; an int fixes it). Targets equal to
``ignore_index`` (-100 by default, the padding label of both conventions) are not counted.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from typing_extensions import override

from core.checks import is_int
from core.data.batches import describe
from core.errors import config_error
from core.metrics.base import Metric

__all__ = ("Accuracy", "F1Score")

Average = Literal["macro", "micro", "binary"]
_AVERAGES = ("macro", "micro", "binary")


def _check_optional_int(field: str, value: object, example: str) -> None:
    if value is not None and not is_int(value):
        raise config_error(field, value, "an int or None", f"e.g. {example}.")


class _ClassMetric(Metric):
    """Shared by the metrics of this module: the class dimension and the ignored targets."""

    def __init__(self, size: int, *, ignore_index: int | None, class_dim: int | None) -> None:
        _check_optional_int("ignore_index", ignore_index, "ignore_index=-100 (or None)")
        _check_optional_int("class_dim", class_dim, "class_dim=1, class_dim=-1 or None")
        super().__init__(size)
        self.ignore_index = ignore_index
        self.class_dim = class_dim

    def dim(self, outputs: Any, targets: Any) -> int:
        """The class dimension of ``outputs`` (non-negative), after checking the shapes
        (tensor metadata only: no device sync)."""
        dim = self.class_dim if self.class_dim is not None else -1 if self.classes_last else 1
        if (
            isinstance(outputs, torch.Tensor)
            and isinstance(targets, torch.Tensor)
            and not (targets.is_floating_point() or targets.is_complex())
            and targets.dtype != torch.bool
            and outputs.ndim == targets.ndim + 1
            and -outputs.ndim <= dim < outputs.ndim
        ):
            found: int = dim % outputs.ndim
            if outputs.shape[:found] + outputs.shape[found + 1 :] == targets.shape:
                return found
        raise ValueError(
            f"{self!r} got outputs {describe(outputs)} and targets {describe(targets)}; "
            f"allowed: class scores with class dimension {dim} and one more dimension than "
            "integer class targets of the same other sizes, e.g. outputs (N, C) and targets "
            "(N,). Fix: pass class_dim= to the metric, convert targets with .long(), or use "
            "a metric of another kind for these outputs."
        )

    def valid(self, targets: torch.Tensor) -> torch.Tensor | None:
        """The targets that count (a bool mask), or None when every target counts."""
        return None if self.ignore_index is None else targets != self.ignore_index

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(ignore_index={self.ignore_index!r})"


class Accuracy(_ClassMetric):
    """The fraction of counted targets among the ``top_k`` highest class scores.

    >>> accuracy = Accuracy(top_k=2)
    >>> scores = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7], [0.6, 0.3, 0.1]])
    >>> accuracy.update(scores, torch.tensor([1, 0, 2]))
    >>> accuracy.compute(accuracy.state())
    0.3333333333333333

    A Hugging Face causal LM's labels are not shifted (the model shifts them), so token
    accuracy over its logits compares each position with its own token: compute it over
    shifted logits yourself, or use ``Perplexity(shift=True)``.
    """

    def __init__(
        self, top_k: int = 1, ignore_index: int | None = -100, *, class_dim: int | None = None
    ) -> None:
        if not (is_int(top_k) and top_k >= 1):
            raise config_error("top_k", top_k, "an integer >= 1", "e.g. Accuracy(top_k=5).")
        super().__init__(size=2, ignore_index=ignore_index, class_dim=class_dim)  # hits, counted
        self.top_k = top_k

    @override
    def update(self, outputs: Any, targets: Any) -> None:
        dim = self.dim(outputs, targets)
        if self.top_k > outputs.shape[dim]:
            raise ValueError(
                f"{self!r} needs at least {self.top_k} classes, but the outputs "
                f"{describe(outputs)} have {outputs.shape[dim]} in dimension {dim}; allowed: "
                f"top_k <= {outputs.shape[dim]}. Fix: lower top_k."
            )
        if self.top_k == 1:
            hits = outputs.argmax(dim) == targets
        else:
            top = outputs.topk(self.top_k, dim).indices
            hits = (top == targets.unsqueeze(dim)).any(dim)
        valid = self.valid(targets)
        if valid is None:
            counted = torch.full((), targets.numel(), device=targets.device)
            self.add(torch.stack([hits.sum(), counted]))
        else:
            self.add(torch.stack([(hits & valid).sum(), valid.sum()]))

    @override
    def compute(self, state: torch.Tensor) -> float | None:
        hits, counted = state.tolist()
        return hits / counted if counted else None

    @override
    def __repr__(self) -> str:
        return f"Accuracy(top_k={self.top_k}, ignore_index={self.ignore_index!r})"


def _f1(tp: float, fp: float, fn: float) -> float | None:
    denominator = 2 * tp + fp + fn
    return 2 * tp / denominator if denominator else None


class F1Score(_ClassMetric):
    """The F1 score of the predicted classes (the argmax of the class scores).

    The state is per-class true positives, false positives and false negatives.
    ``average="macro"`` is the mean F1 over the classes that occur in the targets or the
    predictions; ``"micro"`` pools the counts of every class; ``"binary"`` (two classes) is
    the F1 of class 1. None where nothing was counted.

    >>> f1 = F1Score(num_classes=2, average="binary")
    >>> scores = torch.tensor([[0.2, 0.8], [0.6, 0.4], [0.3, 0.7], [0.9, 0.1]])
    >>> f1.update(scores, torch.tensor([1, 1, 0, 0]))
    >>> f1.compute(f1.state())
    0.5
    """

    def __init__(
        self,
        num_classes: int,
        average: Average = "macro",
        ignore_index: int | None = -100,
        *,
        class_dim: int | None = None,
    ) -> None:
        if not (is_int(num_classes) and num_classes >= 2):
            raise config_error(
                "num_classes",
                num_classes,
                "an integer >= 2 (the size of the class dimension)",
                "e.g. F1Score(num_classes=3).",
            )
        if average not in _AVERAGES:
            raise config_error(
                "average", average, _AVERAGES, "e.g. F1Score(num_classes=3, average='macro')."
            )
        if average == "binary" and num_classes != 2:
            raise config_error(
                "num_classes",
                num_classes,
                "2 with average='binary'",
                "use F1Score(num_classes=2, average='binary'), or average='macro' for more "
                "classes.",
            )
        # [tp of each class, fp of each class, fn of each class]
        super().__init__(3 * num_classes, ignore_index=ignore_index, class_dim=class_dim)
        self.num_classes = num_classes
        self.average: Average = average

    @override
    def update(self, outputs: Any, targets: Any) -> None:
        dim = self.dim(outputs, targets)
        if outputs.shape[dim] != self.num_classes:
            raise ValueError(
                f"{self!r} got outputs {describe(outputs)} with {outputs.shape[dim]} classes "
                f"in dimension {dim}; allowed: {self.num_classes}. Fix: pass "
                f"F1Score(num_classes={outputs.shape[dim]}), or class_dim= if that is not "
                "the class dimension."
            )
        predicted, targets = outputs.argmax(dim).reshape(-1, 1), targets.reshape(-1, 1)
        # One-hot by comparison: deterministic and free of syncs (bincount is neither).
        classes = torch.arange(self.num_classes, device=targets.device)
        is_predicted, is_target = predicted == classes, targets == classes
        valid = self.valid(targets)
        if valid is not None:
            is_predicted &= valid
            is_target &= valid
        tp = (is_predicted & is_target).sum(0)
        self.add(torch.cat([tp, is_predicted.sum(0) - tp, is_target.sum(0) - tp]))

    @override
    def compute(self, state: torch.Tensor) -> float | None:
        c = self.num_classes
        counts = state.tolist()
        tp, fp, fn = counts[:c], counts[c : 2 * c], counts[2 * c :]
        if self.average == "micro":
            return _f1(sum(tp), sum(fp), sum(fn))
        if self.average == "binary":
            return _f1(tp[1], fp[1], fn[1])
        scores = [s for s in map(_f1, tp, fp, fn) if s is not None]
        return sum(scores) / len(scores) if scores else None

    @override
    def __repr__(self) -> str:
        return f"F1Score(num_classes={self.num_classes}, average={self.average!r})"
