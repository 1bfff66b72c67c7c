"""The synchronous step loop: one epoch of optimizer steps.

Plain PyTorch, run in a worker thread by the orchestrator; nothing in here awaits. One
optimizer step, top to bottom::

    window of batches -> each micro-batch: autocast(forward + loss) -> weighted backward
                         (gradient sync only on the window's last micro-batch)
    boundary:            unscale -> total norm -> clip -> [read back step N-1]
                         -> optimizer step (skipped on overflow / non-finite gradients)
                         -> scale update

Host syncs: none per step on CUDA with a fused optimizer. Step N's loss, gradient norm,
skip flag and loss scale are read back during step N+1 (see ``core.loop.readback``); the LR
scheduler is stepped for step N at that point, only if step N was applied, which is before
step N+1's optimizer step, so the schedule is exactly that of an eager loop. The loop knows
where it is (epoch, loader batches consumed) so a checkpoint can resume mid-epoch.
"""

from __future__ import annotations

import gc
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from time import perf_counter
from typing import Any, NamedTuple

import torch
from torch import nn

from core.distributed import Strategy
from core.errors import EmptyLoaderError
from core.hardware.device import device_memory
from core.loop.accumulation import GradientAccumulation, Window
from core.loop.batches import to_device
from core.loop.objective import Objective
from core.loop.readback import Readback
from core.loop.recovery import ErrorHandler, is_out_of_memory
from core.loop.stepper import stepper_for
from core.precision.plugins import Precision
from core.precision.policy import MixedPrecisionTrainer
from core.rng import capture_rng, restore_rng

__all__ = ("EpochStats", "ResumePoint", "StepLoop")

Emit = Callable[..., None]
Scheduler = Any  # torch.optim.lr_scheduler.LRScheduler or anything with .step()


@dataclass
class EpochStats:
    epoch: int
    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    skipped_steps: int = 0
    time_s: float = 0.0
    data_time_s: float = 0.0
    interrupted: bool = False

    @property
    def loss(self) -> float | None:
        return self.loss_sum / self.samples if self.samples else None


class ResumePoint(NamedTuple):
    """Where a checkpoint left an epoch: batches consumed, its statistics, the RNG states."""

    batches_done: int
    stats: EpochStats
    rng_epoch_start: dict[str, Any]
    rng_now: dict[str, Any]


class _Pending(NamedTuple):
    """A finished step whose device scalars are still on their way to the host."""

    readback: Readback
    epoch: int
    step: int
    lr: float
    samples: int
    step_time_s: float
    data_time_s: float


def _no_device_fields() -> dict[str, Any]:
    return {"device_util_pct": None, "device_mem_used_bytes": None}


class StepLoop:
    """Runs optimizer steps for the orchestrator; owns no thread and no file."""

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Scheduler | None,
        precision: MixedPrecisionTrainer,
        accumulation: GradientAccumulation,
        strategy: Strategy,
        objective: Objective,
        errors: ErrorHandler,
        max_grad_norm: float | None,
        emit: Emit,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.precision = precision
        self.accumulation = accumulation
        self.strategy = strategy
        self.objective = objective
        self.errors = errors
        self.max_grad_norm = max_grad_norm
        self.emit = emit
        self.on_step_end: Callable[[], None] | None = None
        self.device_fields: Callable[[], dict[str, Any]] = _no_device_fields
        """Latest device utilisation and memory, merged into every ``train_step`` record."""
        self.device = strategy.device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.stepper = stepper_for(
            optimizer, strategy.device, guard_nonfinite=errors.config.skip_nonfinite
        )
        self.memory = device_memory(self.device)
        self.recover_oom = strategy.world_size == 1 and errors.config.oom_recovery != "off"
        self.global_step = 0
        self.epoch = 0
        self.batches_done = 0
        self.epoch_rng: dict[str, Any] = {}
        self.waiting_for_data_since: float | None = None
        self._pending: _Pending | None = None
        self._stats = EpochStats(epoch=0)
        accumulation.install_sync_skipper(lambda: strategy.no_sync(model))

    # -- an epoch -------------------------------------------------------------------------
    def run_epoch(
        self,
        loader: Iterable[Any],
        epoch: int,
        stop: threading.Event,
        resume: ResumePoint | None = None,
    ) -> EpochStats:
        """Train one epoch (the rest of it after ``resume``); return early, at a step
        boundary all ranks agree on, once ``stop`` is set."""
        self.model.train()
        self.strategy.set_epoch(loader, epoch)
        lockstep = self.strategy.lockstep(loader, "train_loader", epoch=epoch)  # uneven: raises
        batches = self._open_epoch(loader, epoch, resume)
        stats = self._stats
        windows = self.accumulation.windows(batches, start_index=self.batches_done)
        started = tick = perf_counter()
        while True:
            self.waiting_for_data_since = tick  # read by the data-stall watchdog
            try:
                window = next(windows, None)
            except Exception as exc:
                raise self._failure(exc, "loading a batch", self.batches_done) from exc
            finally:
                self.waiting_for_data_since = None
            # Streams: every rank ends the epoch where the first one runs out (lengths known:
            # no collective, they end together).
            uneven = lockstep.uneven_end(0 if window is None else len(window.batches))
            if uneven is not None:
                self.emit("uneven_inputs", epoch=epoch, step=self.global_step,
                          loader="train_loader", **uneven)  # fmt: skip
            if window is None or uneven is not None:
                break
            data_time = perf_counter() - tick
            try:
                self._optimizer_step(window, epoch, data_time, tick)
            except Exception as exc:
                raise self._failure(exc, "the step", window.first_batch_index) from exc
            self.batches_done = window.first_batch_index + len(window.batches)
            if self.on_step_end is not None:
                self.on_step_end()
            tick = perf_counter()
            if self.strategy.should_stop(stop.is_set()):  # agreed by all ranks
                stats.interrupted = True
                break
        stats.interrupted |= self.strategy.settle_stop_votes()
        self.flush()
        stats.time_s += perf_counter() - started
        if stats.steps == 0 and not stats.interrupted:
            raise EmptyLoaderError(
                f"train_loader yielded no batch in epoch {epoch}; allowed: a loader with at "
                "least one batch. Fix: check the dataset length and drop_last."
            )
        return stats

    def _open_epoch(
        self, loader: Iterable[Any], epoch: int, resume: ResumePoint | None
    ) -> Iterator[Any]:
        """The epoch's checked batches; after ``resume``, the same order, consumed ones skipped."""
        self.epoch = epoch
        if resume is None or resume.batches_done == 0:
            if resume is not None:
                restore_rng(resume.rng_now)
            self.batches_done = 0
            self._stats = EpochStats(epoch=epoch)
            self.epoch_rng = capture_rng()  # before the loader draws its shuffle seed
            return self._checked(iter(loader), epoch, 0)
        restore_rng(resume.rng_epoch_start)
        self.epoch_rng = resume.rng_epoch_start
        iterator = iter(loader)
        for _ in itertools.islice(iterator, resume.batches_done):
            pass  # the same shuffle: consume what the interrupted run had trained on
        restore_rng(resume.rng_now)
        self.batches_done = resume.batches_done
        self._stats = replace(resume.stats, interrupted=False)
        return self._checked(iterator, epoch, resume.batches_done)

    def _checked(self, batches: Iterator[Any], epoch: int, start: int) -> Iterator[Any]:
        for index, batch in enumerate(batches, start=start):
            yield self.errors.check_batch(batch, epoch=epoch, batch_index=index)

    def _failure(self, exc: Exception, phase: str, batch_index: int) -> BaseException:
        timeout = getattr(self.strategy, "timeout_s", None)
        return self.errors.step_error(
            exc, epoch=self.epoch, step=self.global_step + 1, batch_index=batch_index,
            rank=self.strategy.rank, timeout_s=timeout, phase=phase,
        )  # fmt: skip

    # -- a step ---------------------------------------------------------------------------
    def _optimizer_step(self, window: Window, epoch: int, data_time: float, tick: float) -> None:
        precision = self.precision.begin_step()
        normaliser = self.strategy.window_normaliser(window.samples)
        while (done := self._accumulate(window, precision, normaliser, epoch)) is None:
            self._shrink_after_oom(window, epoch)
        losses, sizes = done

        grads = [p.grad for p in self.params if p.grad is not None]
        found_inf = precision.unscale_(grads)
        if found_inf is not None:
            found_inf = self.strategy.reduce_found_inf(found_inf)
        grad_norm = self.strategy.total_norm(grads)
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, grad_norm)

        self._resolve_pending()  # step N-1: read back, step the scheduler if it was applied
        lr = float(self.optimizer.param_groups[0]["lr"])
        skipped = self.stepper.step(found_inf, grad_norm)
        readback = Readback(losses, sizes, grad_norm, skipped, precision.loss_scale)
        precision.update(found_inf)
        self.optimizer.zero_grad(set_to_none=True)

        self.global_step += 1
        self._pending = _Pending(
            readback, epoch, self.global_step, lr, window.samples, perf_counter() - tick, data_time
        )

    def _accumulate(
        self, window: Window, precision: Precision, normaliser: float | torch.Tensor, epoch: int
    ) -> tuple[list[torch.Tensor], list[int]] | None:
        """Forward and backward every micro-batch; None after an out-of-memory error."""
        losses: list[torch.Tensor] = []
        sizes: list[int] = []
        try:
            for micro in self.accumulation.micro_batches(window):
                batch = to_device(micro.data, self.device)
                with self.accumulation.sync_context(micro):
                    with precision.autocast():
                        _, loss = self.objective(self.model, batch)
                    loss = self.errors.check_loss(
                        loss, epoch=epoch, batch_index=window.first_batch_index
                    )
                    precision.backward(loss * (micro.samples / normaliser))
                losses.append(loss.detach().float())
                sizes.append(micro.samples)
        except Exception as exc:
            if not (self.recover_oom and is_out_of_memory(exc)):
                raise
            self.optimizer.zero_grad(set_to_none=True)
            return None
        return losses, sizes

    def _shrink_after_oom(self, window: Window, epoch: int) -> None:
        """Free what the failed attempt held and halve the micro-batch (same result)."""
        largest = max(window.sizes)
        size = self.accumulation.halve_micro_batch(largest)
        if size is None:
            raise self.errors.out_of_memory(batch_size=largest, micro_batch_size=1)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.emit(
            "oom_recovered", epoch=epoch, step=self.global_step + 1,
            batch_index=window.first_batch_index, batch_size=largest, micro_batch_size=size,
        )  # fmt: skip

    def _resolve_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        scalars = pending.readback.read()
        if not scalars.skipped and self.scheduler is not None:
            self.scheduler.step()
        self.precision.record_step(
            overflow=scalars.overflow,
            skipped=scalars.skipped,
            step_time_s=pending.step_time_s,
            counts_scaler_update=scalars.loss_scale is not None,
        )
        stats = self._stats
        stats.steps += 1
        stats.samples += pending.samples
        stats.loss_sum += scalars.loss * pending.samples
        stats.skipped_steps += int(scalars.skipped)
        stats.data_time_s += pending.data_time_s
        self.emit(
            "train_step",
            epoch=pending.epoch,
            step=pending.step,
            loss=scalars.loss,
            lr=pending.lr,
            grad_norm=scalars.grad_norm,
            loss_scale=scalars.loss_scale,
            overflow=scalars.overflow,
            skipped=scalars.skipped,
            samples=pending.samples,
            step_time_s=pending.step_time_s,
            data_time_s=pending.data_time_s,
            samples_per_s=pending.samples / pending.step_time_s if pending.step_time_s else None,
            mem_allocated_bytes=self.memory.allocated(),
            max_mem_allocated_bytes=self.memory.max_allocated(),
            **self.device_fields(),
        )
        if scalars.skipped and not scalars.overflow:
            self.emit("nonfinite_skipped", epoch=pending.epoch, step=pending.step,
                      loss=scalars.loss, grad_norm=scalars.grad_norm)  # fmt: skip
        fall_back = self.errors.after_step(
            step=pending.step, skipped=scalars.skipped, overflow=scalars.overflow,
            loss_scale=scalars.loss_scale, min_scale=self.precision.min_scale,
        )  # fmt: skip
        if fall_back:
            before, after = self.precision.fall_back()
            self.emit("precision_fallback", step=pending.step, from_precision=before,
                      to_precision=after, reason="overflow at min_scale")  # fmt: skip

    def flush(self) -> None:
        """Read back the last step (end of epoch, before a checkpoint or a stop)."""
        self._resolve_pending()

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "epoch_stats": asdict(self._stats),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])
        self.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])
        self._stats = EpochStats(**state["epoch_stats"])
