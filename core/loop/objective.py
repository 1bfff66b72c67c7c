"""How a batch becomes a loss (and, for classification, a count of correct predictions).

A pair: ``loss_fn(model(inputs), targets)``; a mapping: ``model(**batch)``, whose loss is the
output itself, ``outputs["loss"]`` or ``outputs.loss`` (Hugging Face models). Without a
``loss_fn`` the loss is ``CrossEntropyLoss()``, and float targets raise
:class:`~core.errors.LossFormatError` at the first step rather than be read as class
probabilities.

Accuracy is counted where the targets are integer class indices and the outputs have one more
dimension (the class dimension 1; targets equal to the loss's ``ignore_index`` not counted);
for dict batches from ``logits`` and integer ``labels`` (class dimension last, -100 not
counted), except a causal LM's output, whose model shifts the labels inside (use
``core.metrics.Perplexity(shift=True)`` for it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Final

import torch
from torch import nn

from core.data.batches import describe
from core.errors import LossFormatError, note_raised_in
from core.loop.recovery import LossSource
from core.metrics import logits_of

__all__ = ("DefaultObjective", "LossFn", "NO_LOSS", "Objective")

LossFn = Callable[[Any, Any], torch.Tensor]

_HF_IGNORE_INDEX = -100  # Hugging Face's label for positions without a target


_MODEL_LOSS = LossSource(
    "the model (a dict batch is called as model(**batch))",
    "a scalar (0-d) floating-point loss tensor, a dict with 'loss', or an object with a "
    ".loss attribute",
    "make the model compute the loss when the batch holds labels (Hugging Face models do), "
    "or pass training_step=fn(model, batch) returning the loss.",
)


class _NoLoss:
    """The loss of a batch whose ``validation_step`` returned metrics without ``'loss'``."""

    def __repr__(self) -> str:
        return "NO_LOSS"


NO_LOSS: Final = _NoLoss()
"""What an objective returns as the loss of a batch it measured metrics of, but no loss."""


def _own_loss(outputs: Any) -> Any:
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, Mapping):
        return outputs.get("loss")
    return getattr(outputs, "loss", None)


class Objective:
    """Computes ``(outputs, loss)`` for a batch, whichever form the batch takes."""

    logs: ClassVar[bool] = False
    """Whether a call may leave values to log in :attr:`logged` (a user's step function)."""
    logged: Mapping[str, Any] = MappingProxyType({})
    """The values the last call returned to be logged with its step (none here)."""
    function: str = "loss_fn"
    """The user's function an error escaping it is named by (``core.errors.raised_in``)."""

    def __init__(self, loss_fn: LossFn) -> None:
        self.loss_fn = loss_fn
        ignore = getattr(loss_fn, "ignore_index", None)
        self.ignore_index: int | None = ignore if isinstance(ignore, int) else None

    def __call__(self, model: nn.Module, batch: Any) -> tuple[Any, Any]:
        if isinstance(batch, Mapping):
            outputs = model(**batch)
            loss = _own_loss(outputs)
            return outputs, outputs if loss is None else loss  # a malformed one is named whole
        inputs, targets = batch
        outputs = model(inputs)
        return outputs, self.loss(outputs, targets)

    def loss(self, outputs: Any, targets: Any) -> Any:
        """The loss of an ``(inputs, targets)`` batch."""
        try:
            return self.loss_fn(outputs, targets)
        except Exception as exc:
            note_raised_in(exc, self.function)
            raise

    def loss_source_of(self, batch: Any) -> LossSource:
        """Who returned ``batch``'s loss, as a malformed loss is named: the model for a
        dict batch, else ``loss_fn``."""
        if isinstance(batch, Mapping):
            return _MODEL_LOSS
        return LossSource(
            self.function,
            "a scalar (0-d) floating-point tensor",
            "make it return the batch's loss as one value, e.g. with reduction='mean' (or 'sum').",
        )

    _evaluation: Objective | None = None

    def evaluated_by(self, evaluation: Objective | None) -> Objective:
        """This objective, with ``evaluation`` (a ``validation_step``) used to evaluate."""
        self._evaluation = evaluation
        return self

    def evaluation(self) -> Objective:
        """The objective validation and ``evaluate()`` use: this one, or the one given to
        :meth:`evaluated_by`."""
        return self._evaluation or self

    @property
    def source(self) -> object:
        """What computes the loss (the run's description names it): ``loss_fn``."""
        return self.loss_fn

    def correct(self, outputs: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(correct, counted)`` device tensors, or None when accuracy does not apply; tensor
        metadata decides, so no device sync. One frame: the step calls it on every batch."""
        if isinstance(batch, Mapping):
            if "CausalLM" in type(outputs).__name__:
                return None
            scores, targets = logits_of(outputs), batch.get("labels")
            ignore_index: int | None = _HF_IGNORE_INDEX
            class_dim = -1
        else:
            scores, targets = outputs, batch[1]
            ignore_index, class_dim = self.ignore_index, 1
        if (
            not isinstance(scores, torch.Tensor)
            or not isinstance(targets, torch.Tensor)
            or targets.is_floating_point()
            or targets.dtype == torch.bool
            or scores.ndim != targets.ndim + 1
            # The scores' shape without the class dimension is the targets' shape.
            or (scores.shape[:1] + scores.shape[2:] if class_dim == 1 else scores.shape[:-1])
            != targets.shape
        ):
            return None
        hits = scores.argmax(dim=class_dim) == targets
        # Counted in float32: one reduction kernel with its cast (a bool sum to int64 is
        # slower on CPU), exact up to 2**24 targets a batch.
        if ignore_index is not None:
            valid = targets != ignore_index
            # A negative ignore_index (cross-entropy's -100) is never a predicted class, so
            # the hits need no mask: one op less on every step.
            correct = hits if ignore_index < 0 else hits & valid
            return correct.sum(dtype=torch.float32), valid.sum(dtype=torch.float32)
        # torch.full, not torch.tensor: a copy from the host would wait for the device.
        counted = torch.full((), targets.numel(), dtype=torch.float32, device=targets.device)
        return hits.sum(dtype=torch.float32), counted


class DefaultObjective(Objective):
    """``CrossEntropyLoss()`` over integer class indices, used when no ``loss_fn`` is given."""

    function = "loss_fn (the default nn.CrossEntropyLoss())"

    def __init__(self) -> None:
        super().__init__(nn.CrossEntropyLoss())

    def loss(self, outputs: Any, targets: Any) -> Any:
        # Tensor metadata only: no device sync.
        if isinstance(targets, torch.Tensor) and (
            targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool
        ):
            raise LossFormatError(
                f"the targets are {describe(targets)} (outputs {describe(outputs)}), but the "
                "default loss_fn, nn.CrossEntropyLoss(), needs integer class indices. Fix: "
                "pass a loss_fn for these targets, e.g. loss_fn=nn.MSELoss() for regression; "
                "convert class labels with targets.long(); for class probabilities pass "
                "loss_fn=nn.CrossEntropyLoss() explicitly."
            )
        # Objective.loss inline, not called: one frame less on every step.
        try:
            return self.loss_fn(outputs, targets)
        except Exception as exc:
            note_raised_in(exc, self.function)
            raise
