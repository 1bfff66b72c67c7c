"""The optimizer step over a window of batches in micro-batches: accumulation, a split
after an out-of-memory error, ranks voting, a model's own loss terms (``core.loop.step``
says which runs take it and where it syncs)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from functools import partial
from time import perf_counter
from typing import Any

import torch
from torch import nn

from core.data.batches import to_device
from core.distributed import Strategy
from core.hardware.device import device_of
from core.loop.accumulation import Accumulation, Window
from core.loop.gradients import GradientUpdate
from core.loop.objective import Objective
from core.loop.readback import Readback
from core.loop.recorder import StepOutcome, StepRecorder
from core.loop.recovery import ErrorHandler
from core.loop.retry import retry_policy
from core.loop.step_function import LoggedValues, joined
from core.loop.terms import ModelTerms
from core.precision.plugins import Precision
from core.precision.policy import PrecisionPolicy

__all__ = ("WindowStep",)

Emit = Callable[..., None]


class WindowStep:
    """One optimizer step over a window of batches, in micro-batches (module docstring)."""

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        policy: PrecisionPolicy,
        accumulation: Accumulation,
        strategy: Strategy,
        objective: Objective,
        errors: ErrorHandler,
        max_grad_norm: float | None,
        recorder: StepRecorder,
        emit: Emit,
        prepare_batch: Callable[[Any], Any] | None = None,
        terms: ModelTerms | None = None,
    ) -> None:
        self.model = model
        self.terms = terms
        self.optimizer = optimizer
        self.policy = policy
        self.accumulation = accumulation
        self.strategy = strategy
        self.objective = objective
        self.errors = errors
        self.recorder = recorder
        self.emit = emit
        self.device = strategy.device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.update = GradientUpdate(
            optimizer,
            strategy,
            max_grad_norm=max_grad_norm,
            guard_nonfinite=errors.config.skip_nonfinite,
            params=self.params,
        )
        self.retry = retry_policy(strategy, device_of(strategy.device), errors)
        self.prepare_batch = prepare_batch or partial(to_device, device=strategy.device)

    def __call__(
        self, window: Window, *, step: int, epoch: int, started: float, data_time_s: float
    ) -> None:
        """Optimizer step number ``step`` over ``window``; ``started`` is its perf_counter()."""
        precision = self.policy.begin_step()  # FP32 | Autocast | ScaledFP16
        self.retry.begin()  # RNG noted where an OOM may make us run the window again
        self.train(
            window, precision, step=step, epoch=epoch, started=started, data_time_s=data_time_s
        )

    def train(
        self,
        window: Window,
        precision: Precision,
        *,
        step: int,
        epoch: int,
        started: float,
        data_time_s: float,
    ) -> None:
        """The step of :meth:`__call__` once it has begun (precision chosen, RNG noted)."""
        while (done := self._forward_backward(window, precision, epoch, step)) is None:
            self.recover(window, step, epoch)  # all ranks, together
        losses, sizes, logged = done
        if not self.retry.sync_in_backward:  # ranks voting: backward did not sync
            self.retry.average_gradients([p.grad for p in self.params if p.grad is not None])
        readback = self.update(
            precision,
            partial(self._readback, losses, sizes, logged),
            before_step=self.recorder.settle,
        )
        self.recorder.pending = StepOutcome(
            readback, epoch, step, window.samples, perf_counter() - started, data_time_s
        )

    def _readback(
        self,
        losses: list[torch.Tensor],
        sizes: list[int],
        logged: list[tuple[Mapping[str, Any], int]],
        *scalars: Any,
    ) -> Readback:
        """The step's readback, the model's statistics and the step function's logged values
        with it (packed after its update)."""
        extra = None if self.terms is None else self.terms.collect()
        if logged:
            extra = joined(extra, LoggedValues(logged))
        return Readback(losses, sizes, extra, *scalars)

    def _forward_backward(
        self, window: Window, precision: Precision, epoch: int, step: int
    ) -> tuple[list[torch.Tensor], list[int], list[tuple[Mapping[str, Any], int]]] | None:
        """Forward and backward of every micro-batch, each loss weighted by the micro-batch's
        share of the window; None when a micro-batch ran out of memory (on any rank)."""
        micro_batches = self.accumulation.micro_batches(window)
        weights = self.accumulation.loss_weights(micro_batches, window, self.strategy)
        if self.terms is not None:
            self.terms.begin_step()  # counted afresh when an OOM makes the window run again
        losses: list[torch.Tensor] = []
        logged: list[tuple[Mapping[str, Any], int]] = []
        objective = self.objective
        for micro, weight in zip(micro_batches, weights, strict=True):
            failed = False
            try:
                batch = self.prepare_batch(micro.data)
                sync = micro.is_last and self.retry.sync_in_backward
                # Backward inside too: FSDP2 reduces gradients during backward.
                with self.strategy.no_backward_sync(self.model, enabled=not sync):
                    with precision.autocast():
                        _, loss = objective(self.model, batch)
                    if objective.logs and objective.logged:
                        logged.append((objective.logged, micro.samples))
                    loss = self.errors.check_loss(
                        loss,
                        epoch=epoch,
                        batch_index=window.first_batch_index,
                        step=step,
                        source=objective.loss_source,
                    )
                    aux = None if self.terms is None else self.terms.auxiliary_loss()
                    total = loss if aux is None else loss + aux
                    # A window of one micro-batch has weight 1.0: no multiply to launch.
                    unweighted = type(weight) is float and weight == 1.0
                    precision.backward(total if unweighted else total * weight)
                losses.append(loss.detach().float())
            except Exception as exc:
                if not self.retry.recoverable(exc):
                    raise
                failed = True  # handled outside ``except``: the traceback holds the memory
            if self.retry.failed_anywhere(failed):  # all ranks vote where they must agree
                return None
        return losses, [m.samples for m in micro_batches], logged

    def recover(self, window: Window, step: int, epoch: int) -> None:
        """After an out-of-memory error: drop the failed attempt's gradients, free memory,
        halve the micro-batch (same result), rewind the RNG; raise when it is already one
        sample, or on thrashing."""
        self.optimizer.zero_grad(set_to_none=True)
        largest = max(window.sizes)
        size = self.accumulation.halve_micro_batch(largest)
        if size is None:
            raise self.errors.out_of_memory(batch_size=largest, micro_batch_size=1)
        self.retry.rewind(step, size)
        gc.collect()
        device_of(self.device).empty_cache()  # a host sync on CUDA, after an OOM only
        self.emit(
            "oom_recovered",
            epoch=epoch,
            step=step,
            batch_index=window.first_batch_index,
            batch_size=largest,
            micro_batch_size=size,
        )
