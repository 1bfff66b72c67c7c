"""One optimizer step over a window of batches, top to bottom in :meth:`OptimizerStep.__call__`.

Plain synchronous PyTorch, run on the step thread. The window's micro-batches each run
forward and loss under the precision's autocast and a backward of the loss weighted by the
micro-batch's share of the window's samples; gradients are synchronised across ranks only
by the last micro-batch's backward. Then: unscale (fp16), overflow flag combined over
ranks, global gradient norm, in-place clip, [step N-1 settled], optimizer step (skipped on
the device on overflow or non-finite gradients), loss-scale update, gradients cleared.

CPU-GPU sync points (CUDA):

- Per step, the only one is lagged: ``recorder.settle()`` reads step N-1's scalars back
  while step N's backward is already queued (see ``core.loop.readback``).
- A non-fused optimizer on CUDA costs one more: its stepper reads the skip flag on the host
  (``core.loop.stepper``); fused AdamW, Adam and SGD skip on the device.
- Ranks with unequal shards (a user's sampler) all-reduce the window's sample count each
  step; over gloo the host waits for that collective (not for the GPU).
- After an out-of-memory error only: ``torch.cuda.empty_cache()`` before the retry.
- Ranks agreeing on OOM (``oom_recovery="on"`` under DDP): a 4-byte vote per micro-batch
  on the gloo control group (the host waits for the other ranks, not for the GPU), and the
  gradients averaged after backward (``core.loop.retry``).

Nothing else reads a device value: the loss checks look at tensor metadata, the gradient
norm and clip stay on the device, and batches are copied with ``non_blocking=True``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from functools import partial
from time import perf_counter
from typing import Any

import torch
from torch import nn

from core.data.batches import to_device
from core.distributed import Strategy
from core.hardware.device import device_of
from core.loop.accumulation import GradientAccumulation, Window
from core.loop.objective import Objective
from core.loop.readback import Readback
from core.loop.recorder import StepOutcome, StepRecorder
from core.loop.recovery import ErrorHandler
from core.loop.retry import retry_policy
from core.loop.stepper import stepper_for
from core.loop.terms import ModelTerms
from core.precision.plugins import Precision
from core.precision.policy import MixedPrecisionTrainer

__all__ = ("OptimizerStep",)

Emit = Callable[..., None]


class OptimizerStep:
    """The body of the step loop: one call, one optimizer step (or one skipped step)."""

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        amp: MixedPrecisionTrainer,
        accumulation: GradientAccumulation,
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
        self.amp = amp
        self.accumulation = accumulation
        self.strategy = strategy
        self.objective = objective
        self.errors = errors
        self.max_grad_norm = max_grad_norm
        self.recorder = recorder
        self.emit = emit
        self.device = strategy.device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.stepper = stepper_for(
            optimizer, strategy.device, guard_nonfinite=errors.config.skip_nonfinite
        )
        self.retry = retry_policy(strategy, device_of(strategy.device), errors)
        self.prepare_batch = prepare_batch or partial(to_device, device=strategy.device)

    def __call__(
        self, window: Window, *, step: int, epoch: int, started: float, data_time_s: float
    ) -> None:
        """Optimizer step number ``step`` over ``window``; ``started`` is its perf_counter()."""
        precision = self.amp.begin_step()  # FP32 | Autocast | ScaledFP16
        self.retry.begin()  # RNG noted where an OOM may make us run the window again
        while (done := self._forward_backward(window, precision, epoch)) is None:
            self._shrink_after_oom(window, step, epoch)  # all ranks, together
        losses, sizes = done

        grads = [p.grad for p in self.params if p.grad is not None]
        self.retry.average_gradients(grads)  # where backward did not sync (ranks voting)
        found_inf = self.strategy.reduce_found_inf(precision.unscale_(grads))  # fp16 only
        grad_norm = self._norm_and_clip(grads)  # device tensor: no host sync
        self.recorder.settle()  # step N-1 read back here, after N's backward is queued
        lr = float(self.optimizer.param_groups[0]["lr"])  # after N-1's scheduler step
        skipped = self.stepper.step(found_inf, grad_norm)  # on the device for fused optimizers
        # Packed (and the copy started) before the update: the record shows the scale used.
        extra = None if self.terms is None else self.terms.collect()
        readback = Readback(losses, sizes, grad_norm, skipped, precision.loss_scale, extra)
        precision.update(found_inf)
        self.optimizer.zero_grad(set_to_none=True)
        self.recorder.defer(
            StepOutcome(
                readback, epoch, step, lr, window.samples, perf_counter() - started, data_time_s
            )
        )

    def _forward_backward(
        self, window: Window, precision: Precision, epoch: int
    ) -> tuple[list[torch.Tensor], list[int]] | None:
        """Forward and backward of every micro-batch, each loss weighted by the micro-batch's
        share of the window; None when a micro-batch ran out of memory (on any rank)."""
        micro_batches = self.accumulation.micro_batches(window)
        weights = self.accumulation.loss_weights(micro_batches, window, self.strategy)
        if self.terms is not None:
            self.terms.begin_step()  # counted afresh when an OOM makes the window run again
        losses: list[torch.Tensor] = []
        for micro, weight in zip(micro_batches, weights, strict=True):
            failed = False
            try:
                batch = self.prepare_batch(micro.data)
                sync = micro.is_last and self.retry.sync_in_backward
                # Backward inside too: FSDP2 reduces gradients during backward.
                with self.strategy.no_backward_sync(self.model, enabled=not sync):
                    with precision.autocast():
                        _, loss = self.objective(self.model, batch)
                    loss = self.errors.check_loss(
                        loss, epoch=epoch, batch_index=window.first_batch_index
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
        return losses, [m.samples for m in micro_batches]

    def _norm_and_clip(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The global 2-norm of the gradients; clipped in place to ``max_grad_norm`` if set."""
        grad_norm = self.strategy.total_norm(grads)
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, grad_norm)
        return grad_norm

    def _shrink_after_oom(self, window: Window, step: int, epoch: int) -> None:
        """Drop the failed attempt's gradients, free memory, halve the micro-batch (same
        result), rewind the RNG; raise when it is already one sample, or on thrashing."""
        self.optimizer.zero_grad(set_to_none=True)
        largest = max(window.sizes)
        size = self.accumulation.halve_micro_batch(largest)
        if size is None:
            raise self.errors.out_of_memory(batch_size=largest, micro_batch_size=1)
        self.retry.rewind(step, size)
        gc.collect()
        device_of(self.device).empty_cache()  # a host sync on CUDA, after an OOM only
        self.emit(
            "oom_recovered", epoch=epoch, step=step, batch_index=window.first_batch_index,
            batch_size=largest, micro_batch_size=size,
        )  # fmt: skip
