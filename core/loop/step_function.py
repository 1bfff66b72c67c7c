"""A step written by the user: ``training_step(model, batch)`` returns the loss.

Lightning's ``training_step``, Composer's ``loss(outputs, batch)`` and Hugging Face
Trainer's ``compute_loss(model, inputs)`` in one shape: a function of the model and one
batch (already on the device) that returns the loss, or a dict::

    def training_step(model, batch):
        inputs, targets = batch
        logits = model(inputs)
        with torch.no_grad():
            teacher_logits = teacher(inputs)
        kd = distillation_loss(logits, teacher_logits)
        ce = F.cross_entropy(logits, targets)
        return {"loss": 0.5 * ce + 0.5 * kd, "ce": ce, "kd": kd, "outputs": logits}

- ``"loss"`` (required): the scalar tensor the step differentiates;
- ``"outputs"`` (optional): what accuracy and ``metrics=`` are computed from, as a model's
  outputs are without a step function (``(outputs, targets)`` of a tuple batch);
- every other entry: a scalar tensor (or number) logged with the step: ``train_step``'s
  ``logged`` field (``record["logged"]["kd"]``), the trackers' ``train/<name>`` and the
  progress line. They are read back with the step's other scalars, one step late, so
  logging them costs no host sync. At validation, they become ``val_<name>`` metrics (a
  ``monitor`` may name them), sample-weighted over the evaluation and every rank.

The function runs inside the run's precision (autocast), accumulation (each micro-batch is
one call; its loss is weighted by its share of the window's samples), distribution, OOM
retry and non-finite guard exactly as the built-in ``loss_fn`` objective does.
``validation_step`` (default: ``training_step``) is called under ``torch.no_grad()`` with
the model in eval mode; its dict may leave ``"loss"`` out (metrics only, as Lightning's
``validation_step`` may): the validation then records no ``val_loss``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from core.data.batches import describe
from core.errors import LossFormatError, note_raised_in
from core.loop.objective import NO_LOSS, DefaultObjective, Objective
from core.loop.recovery import LossSource
from core.loop.terms import StepTermsLike

__all__ = ("LoggedValues", "StepFn", "StepFunction", "joined", "objective_for")

StepFn = Callable[[nn.Module, Any], Any]

_NOT_LOGGED = ("loss", "outputs")


class StepFunction(Objective):
    """The objective of a run given ``training_step`` (and ``validation_step``);
    ``needs_loss=False``: a dict without ``"loss"`` is metrics only (its loss
    :data:`~core.loop.objective.NO_LOSS`)."""

    logs = True

    def __init__(
        self, step: StepFn, *, name: str = "training_step", needs_loss: bool = True
    ) -> None:
        self.step = step
        self.name = self.function = name
        self.needs_loss = needs_loss
        self.loss_fn = None  # type: ignore[assignment]  # the memory trials' synthetic loss
        self.ignore_index = None
        self.logged: Mapping[str, Any] = MappingProxyType({})
        allowed = "a dict with 'loss' (and scalars to log)"
        if not needs_loss:
            allowed = "a dict of scalars, with 'loss' or without (then no val_loss is recorded)"
        self._source = LossSource(
            name,
            f"a scalar (0-d) floating-point loss tensor, or {allowed}",
            "return the loss of the batch, reduced to one value (e.g. loss.mean()).",
        )

    def __call__(self, model: nn.Module, batch: Any) -> tuple[Any, Any]:
        try:
            result = self.step(model, batch)
        except Exception as exc:
            note_raised_in(exc, self.name)
            raise
        if isinstance(result, Mapping) and ("loss" in result or not self.needs_loss):
            self.logged = _logged(result, self.name)
            return result.get("outputs"), result.get("loss", NO_LOSS)
        self.logged = MappingProxyType({})
        # Not a loss (a dict without one, None...): the loss check names what it was, where.
        return None, result

    @property
    def source(self) -> object:
        return self.step

    def loss_source_of(self, batch: Any) -> LossSource:
        return self._source

    def loss(self, outputs: Any, targets: Any) -> Any:
        raise LossFormatError(
            f"this run computes its loss with {self.name}(model, batch); there is no "
            "(outputs, targets) loss to call"
        )

    def correct(self, outputs: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if outputs is None else super().correct(outputs, batch)


def objective_for(
    loss_fn: Callable[[Any, Any], Any] | None,
    training_step: StepFn | None = None,
    validation_step: StepFn | None = None,
) -> Objective:
    """The objective of a run: ``training_step``, else ``loss_fn``, else cross-entropy;
    evaluated by ``validation_step`` where one is given (else by the same)."""
    objective = (
        StepFunction(training_step)
        if training_step is not None
        else DefaultObjective()
        if loss_fn is None
        else Objective(loss_fn)
    )
    evaluation = (
        None
        if validation_step is None
        else StepFunction(validation_step, name="validation_step", needs_loss=False)
    )
    return objective.evaluated_by(evaluation)


def _logged(result: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The entries of a step's dict that are logged, checked (metadata only: no sync)."""
    logged: dict[str, Any] = {}
    for key, value in result.items():
        if key in _NOT_LOGGED:
            continue
        if not (isinstance(key, str) and key.isidentifier()):
            raise LossFormatError(
                f"{name} returned the key {key!r}; allowed: names that are identifiers "
                "(letters, digits and _), e.g. {'loss': loss, 'kd_loss': kd}."
            )
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise LossFormatError(
                    f"{name} returned {key!r} = {describe(value)}; allowed: scalar tensors "
                    "or numbers (they are logged with the step). Fix: reduce it, e.g. "
                    f"{key}.mean(), or return it as 'outputs' for accuracy and metrics=."
                )
            logged[key] = value.detach()
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LossFormatError(
                f"{name} returned {key!r} = {value!r}; allowed: scalar tensors or numbers"
            )
        else:
            logged[key] = value
    return logged


class LoggedValues:
    """A window's logged values on their way to the host: one tensor packed with the
    step's scalars (``core.loop.recorder``), their sample-weighted means on the host."""

    __slots__ = ("_layout", "tensor")

    def __init__(self, per_batch: Sequence[tuple[Mapping[str, Any], int]]) -> None:
        """``per_batch``: each (micro-)batch's logged values and its sample count."""
        values: list[torch.Tensor] = []
        layout: dict[str, list[tuple[int, int]]] = {}
        device = None
        for logged, size in per_batch:
            for key, value in logged.items():
                layout.setdefault(key, []).append((len(values), size))
                if isinstance(value, torch.Tensor):
                    device = value.device
                    values.append(value.reshape(()).float())
                else:
                    values.append(torch.tensor(float(value)))
        self._layout = layout
        self.tensor = torch.stack([v.to(device) if device else v for v in values])

    def fields(self, values: Sequence[float]) -> dict[str, Any]:
        """``{"logged": {name: mean}}`` from the host values of :attr:`tensor`."""
        means = {}
        for key, places in self._layout.items():
            total = sum(size for _, size in places)
            mean = sum(values[i] * size for i, size in places) / total
            means[key] = mean if math.isfinite(mean) else None
        return {"logged": means}


class _Joined:
    """Two sets of a step's statistics as one."""

    __slots__ = ("_first", "_second", "_split", "tensor")

    def __init__(self, first: StepTermsLike, second: StepTermsLike) -> None:
        self._first, self._second, self._split = first, second, first.tensor.numel()
        self.tensor = torch.cat([first.tensor.float(), second.tensor.float()])

    def fields(self, values: Sequence[float]) -> dict[str, Any]:
        split = self._split
        return self._first.fields(values[:split]) | self._second.fields(values[split:])


def joined(first: StepTermsLike | None, second: StepTermsLike | None) -> StepTermsLike | None:
    """Two sets of a step's statistics packed as one (either may be None)."""
    if first is None or second is None:
        return first or second
    return _Joined(first, second)
