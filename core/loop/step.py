"""One optimizer step, read top to bottom (:meth:`OptimizerStep.__call__`), and the one
place the step is built (:func:`build_step`).

The step: forward and loss under the precision's autocast (and, where the targets are class
indices, the batch's correct predictions, read back with the loss), the loss checked, backward;
unscale (fp16), the global gradient norm and its clip; step N-1 read back (the one
deliberate doubling back: ``recorder.settle()``, after step N's backward is queued, so the
host reads N-1 while the device works on N; the LR scheduler is stepped then, so step N runs
at the LR an eager loop would give it); the optimizer step or its skip (the stepper, below);
the loss-scale update; the gradients cleared. What only some runs need is a small named
step it calls: :meth:`~OptimizerStep.micro_batches` (accumulation windows, micro-batches,
token weights, DDP sync on the last backward, a model's own loss terms, ranks voting on
out-of-memory errors) and :meth:`~OptimizerStep.recover` (after an out-of-memory error).

:func:`build_update` builds the post-backward sequence alone (:class:`GradientUpdate`) for
callers that run forward and backward themselves (the four-call facade,
``benchmark_performance``, the learning-rate finder). Nothing else constructs either.

CPU-GPU sync points (CUDA): per step only the lagged read (``core.loop.recorder``); a
non-fused optimizer's stepper reads the skip flag on the host (fused AdamW, Adam and SGD
skip on the device); ranks with unequal shards all-reduce the window's sample count; after
an out-of-memory error ``torch.cuda.empty_cache()``; with ``oom_recovery="on"`` under DDP a
4-byte vote per micro-batch on the gloo control group (``core.loop.retry``). Nothing else
reads a device value: the loss check looks at tensor metadata, the norm and clip stay on
the device, and batches are copied with ``non_blocking=True``.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from operator import attrgetter, is_not
from time import perf_counter
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from core.data.batches import to_device
from core.distributed import Strategy
from core.hardware.device import device_of
from core.loop.accumulation import Accumulation, SampleWeights, Window
from core.loop.objective import Objective
from core.loop.recorder import (
    DeviceFields,
    Readback,
    Scheduler,
    SkipFlag,
    StepOutcome,
    StepRecorder,
)
from core.loop.recovery import ErrorHandler
from core.loop.retry import LocalRetry, NoRetry, retry_policy
from core.loop.step_function import LoggedValues, joined
from core.loop.terms import ModelTerms, StepTermsLike
from core.precision.plugins import Precision
from core.precision.policy import PrecisionPolicy

__all__ = (
    "Applied",
    "Clipping",
    "DeviceSkippingStepper",
    "GradientUpdate",
    "OptimizerStep",
    "OptimizerStepper",
    "build_step",
    "build_update",
    "default_optimizer",
    "stepper_for",
)

Emit = Callable[..., None]

_grad_of = attrgetter("grad")
_is_not_none = partial(is_not, None)
_get_state = torch.Generator.get_state


class Clipping(Protocol):
    """The config section that holds the clip (``OptimConfig``, ``LRFinderConfig``),
    validated where it was built."""

    @property
    def max_grad_norm(self) -> float | None: ...


class Applied(NamedTuple):
    """What :meth:`GradientUpdate.apply` did: the gradient norm (a device tensor), the
    skip flag, the loss scale the step used (None without scaling) and its LR."""

    grad_norm: torch.Tensor
    skipped: SkipFlag
    loss_scale: torch.Tensor | None
    lr: float


class GradientUpdate:
    """The post-backward sequence alone, for a caller that ran forward and backward itself:
    unscale, norm, clip, step or skip, scale update, gradients cleared (built by
    :func:`build_update`)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        strategy: Strategy,
        *,
        max_grad_norm: float | None,
        stepper: OptimizerStepper,
        params: Sequence[nn.Parameter],
    ) -> None:
        self.optimizer = optimizer
        self.strategy = strategy
        self.max_grad_norm = max_grad_norm
        self.stepper = stepper
        self.params = list(params)

    def apply(self, precision: Precision) -> Applied:
        """Apply (or skip) one optimizer step from the gradients the backward left: the
        sequence of :meth:`OptimizerStep.__call__` without the lagged read."""
        grads = list(filter(_is_not_none, map(_grad_of, self.params)))  # C all the way: no frame
        scaled = precision.scales_loss
        found_inf = self.strategy.reduce_found_inf(precision.unscale_(grads)) if scaled else None
        grad_norm = self.strategy.total_norm(grads)  # a device tensor: no host sync
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, grad_norm)
        lr = float(self.optimizer.param_groups[0]["lr"])
        skipped = self.stepper.step(found_inf, grad_norm)
        scale = precision.loss_scale if scaled else None
        # A copy: the scale update below changes the scale in place (no host sync).
        applied = Applied(grad_norm, skipped, None if scale is None else scale.clone(), lr)
        if scaled:
            precision.update(found_inf)
        self.optimizer.zero_grad(set_to_none=True)
        return applied


class OptimizerStep(GradientUpdate):
    """One optimizer step over a window of loader batches (module docstring), built by
    :func:`build_step`. Its second half is :meth:`GradientUpdate.apply`'s sequence, written
    inline so that the lagged read stands where it happens, between the clip and the step."""

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
        recorder: StepRecorder,
        emit: Emit,
        max_grad_norm: float | None,
        stepper: OptimizerStepper,
        retry: NoRetry,
        prepare_batch: Callable[[Any], Any],
        terms: ModelTerms | None,
        counts_accuracy: bool,
    ) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        super().__init__(
            optimizer, strategy, max_grad_norm=max_grad_norm, stepper=stepper, params=params
        )
        self.model = model
        self.policy = policy
        self.accumulation = accumulation
        self.objective = objective
        self.errors = errors
        self.recorder = recorder
        self.emit = emit
        self.retry = retry
        self.prepare_batch = prepare_batch
        self.terms = terms
        # Count each batch's correct predictions where accuracy applies (a few device ops).
        self.counts_accuracy = counts_accuracy
        self.device = strategy.device
        # A step of one batch and one backward runs inline; anything more (accumulation, a
        # split, token weights, unequal windows, ranks voting, model terms) runs as
        # micro-batches. An OOM's split sets micro_batch_size: micro-batches from then on.
        self.windowed = not (
            accumulation.accumulation_steps == 1
            and accumulation.micro_batch_size is None
            and type(accumulation.loss_weights) is SampleWeights
            and strategy.equal_windows
            and retry.sync_in_backward
            and terms is None
        )
        # Only a retry that runs the window again (LocalRetry) notes the RNG before a step.
        self.rewinds = retry if isinstance(retry, LocalRetry) else None
        # The precision of the step in hand, bound when it changes (AMP switched on or off,
        # the fp16 fallback): its autocast context and its backward (the plain one for fp32
        # and bf16, called directly).
        self._precision: Precision | None = None
        self._autocast: AbstractContextManager[Any] = nullcontext()
        self._backward: Callable[[torch.Tensor], None] = torch.Tensor.backward

    def __call__(
        self, window: Window, *, step: int, epoch: int, started: float, data_time_s: float
    ) -> None:
        """Optimizer step number ``step`` over ``window``; ``started`` is its perf_counter()."""
        precision = self.policy.begin_step()  # FP32 | Autocast | ScaledFP16
        if precision is not self._precision:
            self._bind(precision)
        if self.rewinds is not None:
            # An OOM runs the window again with the same draws (a 5 kB host copy, no frame).
            self.rewinds.rng = list(map(_get_state, self.rewinds.generators))
        # Forward and loss under autocast, the loss checked, backward: inline for one batch,
        # as weighted micro-batches for anything more (or since an OOM split the batch).
        if self.windowed or self.accumulation.micro_batch_size is not None:
            losses, extra, hits = self.micro_batches(window, precision, step, epoch)
        else:
            failed = False
            try:
                batch = self.prepare_batch(window.batches[0])
                with self._autocast:
                    outputs, loss = self.objective(self.model, batch)
                # Correct and counted predictions, as device tensors read back with the loss.
                hits = self.objective.correct(outputs, batch) if self.counts_accuracy else None
                outputs = None  # the scores are not kept through backward
                if type(loss) is not torch.Tensor or loss.ndim or not loss.is_floating_point():
                    loss = self._checked(loss, batch, window, step, epoch)  # raises, naming it
                self._backward(loss)
            except Exception as exc:
                if not self.retry.recoverable(exc):
                    raise
                failed = True  # handled outside ``except``: the traceback holds the memory
            if failed:
                self.recover(window, step, epoch)
                losses, extra, hits = self.micro_batches(window, precision, step, epoch)
            else:
                losses = [loss.detach().float()]
                logged = self.objective.logged if self.objective.logs else None
                extra = LoggedValues([(logged, window.samples)]) if logged else None
        # Unscale (fp16: the overflow flag over all ranks), the global norm, the clip.
        grads = list(filter(_is_not_none, map(_grad_of, self.params)))  # C all the way: no frame
        scaled = precision.scales_loss
        found_inf = self.strategy.reduce_found_inf(precision.unscale_(grads)) if scaled else None
        grad_norm = self.strategy.total_norm(grads)  # a device tensor: no host sync
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, grad_norm)
        # The one doubling back, on purpose: step N-1 is read back, recorded and its LR
        # scheduler step taken now, with step N's backward queued ahead of the host's wait.
        self.recorder.settle()
        lr = float(self.optimizer.param_groups[0]["lr"])  # after step N-1's scheduler step
        skipped = self.stepper.step(found_inf, grad_norm)  # on the device for fused ones
        loss_scale = precision.loss_scale if scaled else None  # the scale this step used
        readback = Readback(losses, window.sizes, extra, grad_norm, skipped, loss_scale, lr, hits)
        if scaled:
            precision.update(found_inf)
        self.optimizer.zero_grad(set_to_none=True)
        self.recorder.pending = StepOutcome(
            readback, epoch, step, window.samples, perf_counter() - started, data_time_s
        )

    def _checked(
        self, loss: Any, batch: Any, window: Window, step: int, epoch: int
    ) -> torch.Tensor:
        """The full loss check, for a loss the inline one did not accept (a plain tensor
        needs no call): raises unless ``loss`` is a 0-d floating tensor (a subclass is one),
        naming who returned it for ``batch``."""
        return self.errors.check_loss(
            loss,
            epoch=epoch,
            batch_index=window.first_batch_index,
            step=step,
            source=self.objective.loss_source_of(batch),
        )

    def _bind(self, precision: Precision) -> None:
        self._precision = precision
        self._autocast = precision.autocast()
        plain = type(precision).backward is Precision.backward
        self._backward = torch.Tensor.backward if plain else precision.backward

    def micro_batches(
        self, window: Window, precision: Precision, step: int, epoch: int
    ) -> tuple[list[torch.Tensor], StepTermsLike | None, Sequence[torch.Tensor] | None]:
        """Forward and backward of the window's micro-batches, each loss weighted by its
        share of the window, run again split after an out-of-memory error (on any rank);
        the losses, the model's statistics and logged values, and each micro-batch's
        correct and counted predictions (None: accuracy does not apply to one of them), to
        read back together."""
        while (done := self._weighted_backward(window, precision, step, epoch)) is None:
            self.recover(window, step, epoch)  # all ranks, together
        losses, logged, hits = done
        if not self.retry.sync_in_backward:  # ranks voting: backward did not sync
            self.retry.average_gradients([p.grad for p in self.params if p.grad is not None])
        extra = None if self.terms is None else self.terms.collect()
        return losses, joined(extra, LoggedValues(logged)) if logged else extra, hits

    def _weighted_backward(
        self, window: Window, precision: Precision, step: int, epoch: int
    ) -> (
        tuple[list[torch.Tensor], list[tuple[Mapping[str, Any], int]], list[torch.Tensor] | None]
        | None
    ):
        """One attempt of :meth:`micro_batches`; None when a micro-batch ran out of memory."""
        micro_batches = self.accumulation.micro_batches(window)
        weights = self.accumulation.loss_weights(micro_batches, window, self.strategy)
        if self.terms is not None:
            self.terms.begin_step()  # counted afresh when an OOM makes the window run again
        losses: list[torch.Tensor] = []
        logged: list[tuple[Mapping[str, Any], int]] = []
        hits: list[torch.Tensor] | None = [] if self.counts_accuracy else None
        objective = self.objective
        for micro, weight in zip(micro_batches, weights, strict=True):
            failed = False
            try:
                batch = self.prepare_batch(micro.data)
                sync = micro.is_last and self.retry.sync_in_backward
                # Backward inside too: FSDP2 reduces gradients during backward.
                with self.strategy.no_backward_sync(self.model, enabled=not sync):
                    with precision.autocast():
                        outputs, loss = objective(self.model, batch)
                    if hits is not None:
                        counts = objective.correct(outputs, batch)
                        hits = None if counts is None else [*hits, *counts]
                    outputs = None  # the scores are not kept through backward
                    if objective.logs and objective.logged:
                        logged.append((objective.logged, micro.samples))
                    if type(loss) is not torch.Tensor or loss.ndim or not loss.is_floating_point():
                        loss = self._checked(loss, batch, window, step, epoch)  # raises, naming it
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
        return losses, logged, hits

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


class OptimizerStepper:
    """Steps the optimizer unless the loss scaler found an overflow or (with the non-finite
    guard) the gradient norm is inf/NaN, deciding on the host: free on CPU, one device sync
    per step on CUDA (the fallback for non-fused optimizers). A skipped step leaves weights,
    optimizer state and step count untouched."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, guard_nonfinite: bool) -> None:
        self.optimizer = optimizer
        self.guard_nonfinite = guard_nonfinite

    def step(self, found_inf: torch.Tensor | None, grad_norm: torch.Tensor) -> SkipFlag:
        if found_inf is None and not self.guard_nonfinite:
            self.optimizer.step()
            return None
        skip = found_inf is not None and bool(found_inf.item())  # host read (see class doc)
        if not skip and self.guard_nonfinite:
            skip = not math.isfinite(float(grad_norm))
        if not skip:
            self.optimizer.step()
        return skip


class DeviceSkippingStepper(OptimizerStepper):
    """CUDA with a fused optimizer (``AdamW(fused=True)``, Adam, SGD): the skip happens on
    the device and the host never waits."""

    def step(self, found_inf: torch.Tensor | None, grad_norm: torch.Tensor) -> SkipFlag:
        if found_inf is None and self.guard_nonfinite:
            found_inf = (~torch.isfinite(grad_norm)).float()
        # Fused kernels read these attributes: grads are already unscaled (grad_scale None)
        # and the update, step count included, is skipped where found_inf is non-zero.
        self.optimizer.found_inf = found_inf  # type: ignore[attr-defined]
        self.optimizer.grad_scale = None  # type: ignore[attr-defined]
        self.optimizer.step()
        return found_inf


def stepper_for(
    optimizer: torch.optim.Optimizer, device: torch.device, *, guard_nonfinite: bool
) -> OptimizerStepper:
    """The stepper for ``optimizer`` on ``device`` (chosen once)."""
    fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
    kind = DeviceSkippingStepper if fused and device_of(device).is_cuda else OptimizerStepper
    return kind(optimizer, guard_nonfinite=guard_nonfinite)


def default_optimizer(
    params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """AdamW, fused where torch supports it (floating parameters on CPU or CUDA)."""
    params = list(params)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


def build_step(
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    policy: PrecisionPolicy,
    strategy: Strategy,
    objective: Objective,
    errors: ErrorHandler,
    optim: Clipping,
    emit: Emit,
    scheduler: Scheduler | None = None,
    accumulation: Accumulation | None = None,
    device_fields: DeviceFields | None = None,
    prepare_batch: Callable[[Any], Any] | None = None,
    terms: ModelTerms | None = None,
    step_accuracy: bool = True,
) -> OptimizerStep:
    """The step for a run of these parts: its recorder (the lagged read, ``scheduler``
    stepped there), its stepper (skips on the device where the optimizer can), its OOM
    retry (``errors.config.oom_recovery`` on ``strategy``), the clip ``optim`` holds.

    ``prepare_batch`` moves a batch to the device (default ``to_device``); ``terms`` are a
    model's own loss terms and statistics (``core.loop.terms``); ``device_fields`` the
    monitor's latest figures for each ``train_step`` record; ``step_accuracy`` counts each
    step's correct predictions for its record where the targets are class indices.
    """
    device = device_of(strategy.device)
    guard_nonfinite = errors.config.skip_nonfinite
    return OptimizerStep(
        model=model,
        optimizer=optimizer,
        policy=policy,
        accumulation=accumulation or Accumulation(),
        strategy=strategy,
        objective=objective,
        errors=errors,
        recorder=StepRecorder(
            scheduler=scheduler,
            precision=policy,
            errors=errors,
            device=device,
            emit=emit,
            device_fields=device_fields,
        ),
        emit=emit,
        max_grad_norm=optim.max_grad_norm,
        stepper=stepper_for(optimizer, strategy.device, guard_nonfinite=guard_nonfinite),
        retry=retry_policy(strategy, device, errors),
        prepare_batch=prepare_batch or partial(to_device, device=strategy.device),
        terms=terms,
        counts_accuracy=step_accuracy,
    )


def build_update(
    optimizer: torch.optim.Optimizer,
    strategy: Strategy,
    *,
    optim: Clipping,
    guard_nonfinite: bool,
    params: Sequence[nn.Parameter] | None = None,
) -> GradientUpdate:
    """The post-backward sequence for ``optimizer`` (its parameters, or ``params``), the
    clip ``optim`` holds; ``guard_nonfinite`` skips a step whose gradient norm is not
    finite.
    """
    if params is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
    return GradientUpdate(
        optimizer,
        strategy,
        max_grad_norm=optim.max_grad_norm,
        stepper=stepper_for(optimizer, strategy.device, guard_nonfinite=guard_nonfinite),
        params=params,
    )
