"""Seed 002's ``train_step``/``validate_step``: one optimizer step per call, on the run's parts.

:class:`EagerSteps` hands the run's step kernel (``core.loop.step``) a one-batch window per
call and settles the step before it returns: one device sync per call, by design.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import torch
from torch import nn

from core.data.batches import count_samples, to_device
from core.distributed.base import Strategy
from core.facades.eager.emit import Emit
from core.loop.accumulation import Window
from core.loop.objective import DefaultObjective, LossFn, Objective
from core.loop.recorder import EpochStats, Scheduler, StepScalars
from core.loop.recovery import ErrorHandler
from core.loop.step import Clipping, build_step
from core.memory.amp_savings import measure_amp_savings
from core.moe.probe import MoEProbe
from core.precision.plugins import FP32, Precision
from core.precision.policy import PrecisionPolicy

__all__ = ("CountingObjective", "EagerSteps")


class CountingObjective(Objective):
    """The run's objective (``loss_fn``, or cross-entropy without one) that also counts each
    forward's correct predictions, as device tensors (no sync)."""

    def __init__(self, loss_fn: LossFn | None = None) -> None:
        super().__init__(nn.CrossEntropyLoss())
        self.use(loss_fn)
        self.hits: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.applies = True

    def use(self, loss_fn: LossFn | None) -> None:
        """Compute losses with ``loss_fn`` from now on (None: the default objective)."""
        self.base = DefaultObjective() if loss_fn is None else Objective(loss_fn)
        self.loss_fn, self.ignore_index = self.base.loss_fn, self.base.ignore_index
        self.given = loss_fn

    def loss(self, outputs: Any, targets: Any) -> Any:
        return self.base.loss(outputs, targets)

    def __call__(self, model: nn.Module, batch: Any) -> tuple[Any, Any]:
        outputs, loss = super().__call__(model, batch)
        hits = self.correct(outputs, batch)
        if hits is None:
            self.applies = False
        else:
            self.hits.append(hits)
        return outputs, loss

    def take_counts(self) -> tuple[float, float] | None:
        """``(correct, counted)`` since the last call (None: accuracy does not apply)."""
        hits, applies = self.hits, self.applies
        self.hits, self.applies = [], True
        if not applies or not hits:
            return None
        # Host sync: the per-batch facade returns its accuracy now (see the module docstring).
        totals = torch.stack([torch.stack([c, n]).double() for c, n in hits]).sum(0).tolist()
        return float(totals[0]), float(totals[1])


class EagerSteps:
    """One optimizer step per :meth:`train_step` call, read back before it returns.

    With ``track_memory`` the first call measures AMP's memory saving on its batch.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        policy: PrecisionPolicy,
        emit: Emit,
        optim: Clipping,
        loss_fn: LossFn | None = None,
        scheduler: Scheduler | None = None,
        errors: ErrorHandler | None = None,
        track_memory: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.policy = policy
        self.device = policy.device
        self.strategy = Strategy(self.device)
        self.objective = CountingObjective(loss_fn)
        self.errors = errors or ErrorHandler()
        self.step = build_step(
            model=model,
            optimizer=optimizer,
            policy=policy,
            strategy=self.strategy,
            objective=self.objective,
            errors=self.errors,
            optim=optim,
            emit=emit,
            scheduler=scheduler,
            terms=MoEProbe.of(model),  # an MoE model's balancing loss and counts
        )
        self.recorder = self.step.recorder
        self.steps_done = 0
        self.track_memory = track_memory
        self.correct = 0.0  # correct predictions since begin_epoch (with counted: the accuracy)
        self.counted = 0.0

    @property
    def stats(self) -> EpochStats:
        return self.recorder.stats

    def begin_epoch(self, epoch: int) -> None:
        self.recorder.stats = EpochStats(epoch=epoch)
        self.correct = self.counted = 0.0

    def current_precision(self) -> Precision:
        """The precision the next step runs in (the AMP switch applied)."""
        return self.policy.amp_precision if self.policy.amp_enabled else FP32()

    def _use(self, loss_fn: LossFn | None) -> None:
        if loss_fn is not None and loss_fn is not self.objective.given:
            self.objective.use(loss_fn)

    def train_step(self, batch: Any, loss_fn: LossFn | None = None) -> dict[str, Any]:
        """One optimizer step on ``batch``; ``loss_fn`` replaces the loss from now on. Returns
        ``loss``, ``accuracy`` (None unless targets are class indices), ``step_time`` (s,
        readback included), ``loss_scale`` (None without a scaler), ``overflow``,
        ``skipped``, ``lr``, ``grad_norm``, ``precision``, ``samples``."""
        self.model.train()
        self._use(loss_fn)
        epoch = self.stats.epoch
        batch = self.errors.check_batch(batch, epoch=epoch, batch_index=self.steps_done)
        samples = count_samples(batch)
        if self.track_memory:
            self.track_memory = False
            self.policy.note_memory_savings(
                *measure_amp_savings(
                    self.model,
                    batch,
                    objective=self.objective.base,
                    precision=self.policy.amp_precision,
                    device=self.device,
                )
            )
        window = Window([batch], [samples], self.steps_done, samples)
        lr = float(self.optimizer.param_groups[0]["lr"])
        started = perf_counter()
        self.step(window, step=self.steps_done + 1, epoch=epoch, started=started, data_time_s=0.0)
        precision = self.policy.precision.name
        scalars = self.recorder.settle()  # this step, read back now: the facade is synchronous
        assert isinstance(scalars, StepScalars)  # the step above deferred one
        counts = self.objective.take_counts()
        step_time = perf_counter() - started
        self.steps_done += 1
        if counts is not None:
            self.correct += counts[0]
            self.counted += counts[1]
        return {
            "loss": scalars.loss,
            "accuracy": counts[0] / counts[1] if counts and counts[1] else None,
            "step_time": step_time,
            "loss_scale": scalars.loss_scale,
            "overflow": scalars.overflow,
            "skipped": scalars.skipped,
            "lr": lr,
            "grad_norm": scalars.grad_norm,
            "precision": precision,
            "samples": samples,
            **scalars.extra,  # an MoE model's moe_aux_loss, moe_tokens_per_expert, ...
        }

    @torch.no_grad()
    def validate_step(self, batch: Any, loss_fn: LossFn | None = None) -> dict[str, Any]:
        """Loss and accuracy of ``batch`` in eval mode under no_grad and the current
        precision's autocast (the model's mode is restored after)."""
        self._use(loss_fn)
        was_training = self.model.training
        self.model.eval()
        try:
            batch = to_device(self.errors.check_batch(batch, epoch=0, batch_index=0), self.device)
            with self.current_precision().autocast():
                _, loss = self.objective(self.model, batch)
            loss = self.errors.check_loss(loss, epoch=self.stats.epoch, batch_index=0)
            counts = self.objective.take_counts()
        finally:
            self.model.train(was_training)
        return {
            "loss": float(loss.float()),  # host sync: the facade returns values (module doc)
            "accuracy": counts[0] / counts[1] if counts and counts[1] else None,
            "samples": count_samples(batch),
        }
