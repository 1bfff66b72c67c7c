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

Nothing else reads a device value: the loss checks look at tensor metadata, the gradient
norm and clip stay on the device, and batches are copied with ``non_blocking=True``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from time import perf_counter

import torch
from torch import nn

from core.distributed import Strategy
from core.hardware.device import device_of
from core.loop.accumulation import GradientAccumulation, Window
from core.loop.batches import to_device
from core.loop.objective import Objective
from core.loop.readback import Readback
from core.loop.recorder import StepOutcome, StepRecorder
from core.loop.recovery import ErrorHandler, is_out_of_memory
from core.loop.stepper import stepper_for
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
    ) -> None:
        self.model = model
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
        self.recover_oom = strategy.world_size == 1 and errors.config.oom_recovery != "off"

    def __call__(
        self, window: Window, *, step: int, epoch: int, started: float, data_time_s: float
    ) -> None:
        """Optimizer step number ``step`` over ``window``; ``started`` is its perf_counter()."""
        precision = self.amp.begin_step()  # FP32 | Autocast | ScaledFP16
        normaliser = self.strategy.window_normaliser(window.samples)
        while True:  # once, or again with halved micro-batches after an out-of-memory error
            losses: list[torch.Tensor] = []
            sizes: list[int] = []
            try:
                for micro in self.accumulation.micro_batches(window):
                    batch = to_device(micro.data, self.device)
                    # Backward inside too: FSDP2 reduces gradients during backward.
                    with self.strategy.no_backward_sync(self.model, enabled=not micro.is_last):
                        with precision.autocast():
                            _, loss = self.objective(self.model, batch)
                        loss = self.errors.check_loss(
                            loss, epoch=epoch, batch_index=window.first_batch_index
                        )
                        precision.backward(loss * (micro.samples / normaliser))
                    losses.append(loss.detach().float())
                    sizes.append(micro.samples)
                break
            except Exception as exc:
                if not (self.recover_oom and is_out_of_memory(exc)):
                    raise
            self._shrink_after_oom(window, step, epoch)  # outside except: frees the traceback

        grads = [p.grad for p in self.params if p.grad is not None]
        found_inf = self.strategy.reduce_found_inf(precision.unscale_(grads))  # fp16 only
        grad_norm = self._norm_and_clip(grads)  # device tensor: no host sync
        self.recorder.settle()  # step N-1 read back here, after N's backward is queued
        lr = float(self.optimizer.param_groups[0]["lr"])  # after N-1's scheduler step
        skipped = self.stepper.step(found_inf, grad_norm)  # on the device for fused optimizers
        # Packed (and the copy started) before the update: the record shows the scale used.
        readback = Readback(losses, sizes, grad_norm, skipped, precision.loss_scale)
        precision.update(found_inf)
        self.optimizer.zero_grad(set_to_none=True)
        self.recorder.defer(
            StepOutcome(
                readback, epoch, step, lr, window.samples, perf_counter() - started, data_time_s
            )
        )

    def _norm_and_clip(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The global 2-norm of the gradients; clipped in place to ``max_grad_norm`` if set."""
        grad_norm = self.strategy.total_norm(grads)
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, grad_norm)
        return grad_norm

    def _shrink_after_oom(self, window: Window, step: int, epoch: int) -> None:
        """Drop the failed attempt's gradients, free memory, halve the micro-batch (same
        result); raise when it is already one sample."""
        self.optimizer.zero_grad(set_to_none=True)
        largest = max(window.sizes)
        size = self.accumulation.halve_micro_batch(largest)
        if size is None:
            raise self.errors.out_of_memory(batch_size=largest, micro_batch_size=1)
        gc.collect()
        device_of(self.device).empty_cache()  # a host sync on CUDA, after an OOM only
        self.emit(
            "oom_recovered", epoch=epoch, step=step, batch_index=window.first_batch_index,
            batch_size=largest, micro_batch_size=size,
        )  # fmt: skip
