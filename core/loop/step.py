"""One optimizer step, in the kernel the run was built for.

Two kernels, chosen once when the loop is built (:func:`optimizer_step_for`), both ending
in the one post-backward sequence (``core.loop.gradients``):

- :class:`BatchStep`, the plain case: one loader batch per step, one backward, gradients
  synchronised by that backward where there are several ranks (DDP's own), no model terms.
  Forward and loss under the precision's autocast, the loss checked, backward, then the
  update. Nothing is called that would do nothing: no window weights, no sync context, no
  rank vote.
- :class:`WindowStep`, everything else: windows of several batches (accumulation),
  micro-batches (``micro_batch_size``, or halved after an out-of-memory error), each
  micro-batch's loss weighted by its share of the window's samples (or tokens), gradients
  synchronised by the last micro-batch's backward only, ranks voting on out-of-memory
  errors, a model's own loss terms and statistics.

Both take step N-1's readback after step N's backward is queued and before its optimizer
step (``before_step`` of the update), so the host reads N-1 while the device works on N.

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

An out-of-memory error in a :class:`BatchStep` is recovered by its :class:`WindowStep`: the
micro-batch is halved, the random generators rewound, and the window run again split; from
then on the split windows take the :class:`WindowStep`.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from time import perf_counter
from typing import Any

import torch
from torch import nn

from core.data.batches import to_device
from core.distributed import Strategy
from core.hardware.device import device_of
from core.loop.accumulation import GradientAccumulation, SampleWeights, Window
from core.loop.gradients import GradientUpdate
from core.loop.objective import Objective
from core.loop.readback import Readback
from core.loop.recorder import StepOutcome, StepRecorder
from core.loop.recovery import ErrorHandler
from core.loop.retry import LocalRetry, retry_policy
from core.loop.terms import ModelTerms
from core.precision.plugins import Precision
from core.precision.policy import MixedPrecisionTrainer

__all__ = ("BatchStep", "OptimizerStep", "WindowStep", "optimizer_step_for")

Emit = Callable[..., None]


class WindowStep:
    """One optimizer step over a window of batches, in micro-batches (module docstring)."""

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
        precision = self.amp.begin_step()  # FP32 | Autocast | ScaledFP16
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
        while (done := self._forward_backward(window, precision, epoch)) is None:
            self.recover(window, step, epoch)  # all ranks, together
        losses, sizes = done
        if not self.retry.sync_in_backward:  # ranks voting: backward did not sync
            self.retry.average_gradients([p.grad for p in self.params if p.grad is not None])
        readback = self.update(
            precision, partial(self._readback, losses, sizes), before_step=self.recorder.settle
        )
        self.recorder.pending = StepOutcome(
            readback, epoch, step, window.samples, perf_counter() - started, data_time_s
        )

    def _readback(self, losses: list[torch.Tensor], sizes: list[int], *scalars: Any) -> Readback:
        """The step's readback, the model's statistics with it (packed after its update)."""
        extra = None if self.terms is None else self.terms.collect()
        return Readback(losses, sizes, extra, *scalars)

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


class BatchStep:
    """One optimizer step over one loader batch, one backward (module docstring).

    Built only where that is the whole step (:func:`optimizer_step_for`); a batch split
    after an out-of-memory error goes to ``windows``, the :class:`WindowStep` beside it.
    """

    def __init__(self, windows: WindowStep) -> None:
        self.windows = windows
        self.model = windows.model
        self.amp = windows.amp
        self.objective = windows.objective
        self.check_loss = windows.errors.check_loss
        self.prepare_batch = windows.prepare_batch
        self.update = windows.update
        self.recorder = windows.recorder
        self.accumulation = windows.accumulation
        # Only a policy that retries is told anything: the RNG state before each step.
        retry = windows.retry
        self.retry = retry if isinstance(retry, LocalRetry) else None
        self.rng_state = device_of(windows.device).rng_state
        # What the precision of the step in hand does, bound when it changes (AMP switched
        # on or off, the fp16 fallback): its autocast context and its backward.
        self._precision: Precision | None = None
        self._autocast: AbstractContextManager[Any] = nullcontext()
        self._backward: Callable[[torch.Tensor], None] = torch.Tensor.backward

    def _bind(self, precision: Precision) -> None:
        self._precision = precision
        self._autocast = precision.autocast()
        # A precision whose backward is the plain one (fp32, bf16) is not called for it.
        plain = type(precision).backward is Precision.backward
        self._backward = torch.Tensor.backward if plain else precision.backward

    def __call__(
        self, window: Window, *, step: int, epoch: int, started: float, data_time_s: float
    ) -> None:
        """Optimizer step number ``step`` over ``window`` (one batch)."""
        if self.accumulation.micro_batch_size is not None:  # split since an OOM
            self.windows(window, step=step, epoch=epoch, started=started, data_time_s=data_time_s)
            return
        precision = self.amp.begin_step()  # FP32 | Autocast | ScaledFP16
        if precision is not self._precision:
            self._bind(precision)
        retry = self.retry
        if retry is not None:
            retry.rng = self.rng_state()  # an OOM runs the batch again, split, same draws
        failed = False
        try:
            batch = self.prepare_batch(window.batches[0])
            with self._autocast:
                _, loss = self.objective(self.model, batch)
            loss = self.check_loss(loss, epoch=epoch, batch_index=window.first_batch_index)
            self._backward(loss)
        except Exception as exc:
            if retry is None or not retry.recoverable(exc):
                raise
            failed = True  # handled outside ``except``: the traceback holds the memory
        if failed:
            self.windows.recover(window, step, epoch)
            self.windows.train(
                window, precision, step=step, epoch=epoch, started=started, data_time_s=data_time_s
            )
            return
        pack = partial(Readback, [loss.detach().float()], window.sizes, None)
        readback = self.update(precision, pack, before_step=self.recorder.settle)
        self.recorder.pending = StepOutcome(
            readback, epoch, step, window.samples, perf_counter() - started, data_time_s
        )


OptimizerStep = WindowStep | BatchStep


def optimizer_step_for(windows: WindowStep) -> OptimizerStep:
    """The kernel for the run ``windows`` was built for: :class:`BatchStep` where a step is
    one batch and one backward (no accumulation or split, samples weighting with equal
    windows on every rank, gradients synced by that backward, no model terms), else
    ``windows`` itself."""
    accumulation = windows.accumulation
    plain = (
        accumulation.accumulation_steps == 1
        and accumulation.micro_batch_size is None
        and type(accumulation.loss_weights) is SampleWeights
        and windows.strategy.equal_windows
        and windows.retry.sync_in_backward
        and windows.terms is None
    )
    return BatchStep(windows) if plain else windows
