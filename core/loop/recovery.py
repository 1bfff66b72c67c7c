"""The ErrorHandler: check what users hand in, classify failures, and decide what happens.

Recover where it is safe: an out-of-memory step is re-split (same result), a non-finite step
skipped and counted, fp16 overflowing at its minimum scale falls back to bf16 (else fp32),
once. Stop clearly where it is not: a malformed batch or loss, too many non-finite steps in
a row, an exception from user code, a collective that timed out; the error names the
function, epoch, step and batch (the table: ``docs/checkpoints-and-reliability.md``). The
per-step checks read Python attributes and tensor metadata only: no device sync.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import torch

from core.checks import check_bool_fields, is_int
from core.data.batches import check_batch, describe
from core.errors import (
    CoreError,
    DistributedTimeoutError,
    LossFormatError,
    NonFiniteLossError,
    OutOfMemoryError,
    TrainingStepError,
    config_error,
    raised_in,
)
from core.flat_keyword import flat

__all__ = ("ErrorHandler", "ErrorHandlerConfig", "LossSource", "Place")

_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")
_TIMEOUT_MESSAGES = ("timed out", "timeout", "connection closed by peer", "connection reset")


@dataclass(frozen=True, kw_only=True)
class ErrorHandlerConfig:
    """How far the ErrorHandler goes to keep a run alive.

    ``oom_recovery="auto"`` re-splits batches after out-of-memory errors in one process
    (the micro-batch halves, the window's result is unchanged); ``"on"`` does it under DDP
    too, where ranks vote after every micro-batch (a 4-byte all-reduce each) and gradients
    are averaged after backward instead of during it (``core.loop.retry``); FSDP2 cannot.
    ``oom_thrash_steps`` consecutive optimizer steps that each needed a re-split stop the
    run: memory then grows from step to step, which halving cannot fix.
    """

    skip_nonfinite: bool = True
    max_consecutive_nonfinite: int = field(default=10, metadata=flat("max_consecutive_nonfinite"))
    precision_fallback: bool = True
    overflows_at_min_scale_before_fallback: int = 3
    oom_recovery: Literal["auto", "on", "off"] = field(
        default="auto", metadata=flat("oom_recovery")
    )
    oom_thrash_steps: int = 3

    def __post_init__(self) -> None:
        check_bool_fields(self)
        for name in (
            "max_consecutive_nonfinite",
            "overflows_at_min_scale_before_fallback",
            "oom_thrash_steps",
        ):
            value = getattr(self, name)
            if not (is_int(value) and value >= 1):
                raise config_error(name, value, "an integer >= 1")
        if self.oom_recovery not in ("auto", "on", "off"):
            raise config_error("oom_recovery", self.oom_recovery, ("auto", "on", "off"))


def is_out_of_memory(exc: BaseException) -> bool:
    """``torch.OutOfMemoryError`` and the allocators' message forms (CUDA and host)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, (RuntimeError, MemoryError)) and any(
        m in str(exc).lower() for m in _OOM_MESSAGES
    )


def is_collective_failure(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _TIMEOUT_MESSAGES)


@dataclass(frozen=True)
class Place:
    """Where in a run something failed, as messages name it: ``epoch 0, step 3, batch 2``;
    in a validation ``epoch 0, step 8, validation batch 1`` (``step``: the optimizer steps
    the model had taken; None outside a run). Built only once something failed."""

    epoch: int
    step: int | None = None
    batch_index: int | None = None
    validation: bool = False

    def __str__(self) -> str:
        named = [f"epoch {self.epoch}"]
        if self.step is not None:
            named.append(f"step {self.step}")
        batch = "validation batch" if self.validation else "batch"
        if self.batch_index is not None:
            named.append(f"{batch} {self.batch_index}")
        elif self.validation:
            named.append("after the last validation batch")
        return ", ".join(named)


class LossSource(NamedTuple):
    """Who returned a batch's loss (``training_step``, ``validation_step``, ``loss_fn``, the
    model), what it may return, and how to fix a malformed return: a malformed loss's
    message names them (``Objective.loss_source_of``)."""

    name: str
    allowed: str
    fix: str


class ErrorHandler:
    """Checks, classifications and the counters behind the decisions above."""

    def __init__(self, config: ErrorHandlerConfig | None = None) -> None:
        self.config = config or ErrorHandlerConfig()
        self.consecutive_nonfinite = 0
        self.own_nonfinite_losses = 0  # of those, steps where this rank's own loss was
        self.overflows_at_min_scale = 0
        self.streak_open = False
        """Whether a run of non-finite steps or of overflows at the minimum scale is being
        counted: only then does an applied step need :meth:`after_step` (it ends the run)."""

    # -- user input -----------------------------------------------------------------------
    def check_batch(self, batch: Any, *, epoch: int, batch_index: int) -> Any:
        """Return ``batch`` if it is an ``(inputs, targets)`` pair or a mapping; else raise."""
        return check_batch(batch, epoch=epoch, batch_index=batch_index)

    def check_loss(
        self,
        loss: Any,
        *,
        epoch: int,
        batch_index: int,
        step: int | None = None,
        source: LossSource | None = None,
        validation: bool = False,
    ) -> torch.Tensor:
        """Return ``loss`` if it is a 0-d floating tensor; else raise naming what it was,
        where (:class:`Place`), and ``source``, who returned it (None: a caller that does not
        know, such as the per-batch facades)."""
        if isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.is_floating_point():
            return loss
        place = Place(epoch, step, batch_index, validation)
        if source is None:
            raise LossFormatError(
                f"the loss in {place} is {describe(loss)}; allowed: a scalar (0-d) "
                "floating-point tensor. Fix: use a loss_fn with reduction='mean' (or 'sum'), "
                "or for dict batches make the model return the loss, a dict with 'loss', or "
                "an object with a .loss attribute."
            )
        if isinstance(loss, Mapping):  # a step function's dict has no 'loss'
            raise LossFormatError(
                f"{source.name} returned a dict without 'loss' (keys: "
                f"{sorted(map(str, loss))}) in {place}; allowed: {source.allowed}. Fix: return "
                "{'loss': loss, ...}."
            )
        raise LossFormatError(
            f"{source.name} returned {describe(loss)} in {place}; allowed: {source.allowed}. "
            f"Fix: {source.fix}"
        )

    # -- decisions after a step (from the lagged readback) -------------------------------
    def after_step(
        self,
        *,
        step: int,
        skipped: bool,
        overflow: bool,
        loss_scale: float | None,
        min_scale: float,
        loss_finite: bool = True,
    ) -> bool:
        """Count one step's outcome; True when fp16 should fall back. Raises
        NonFiniteLossError after too many non-finite steps in a row (``loss_finite``: this
        rank's own loss, which names the culprit under several ranks)."""
        nonfinite = skipped and not overflow
        self.consecutive_nonfinite = self.consecutive_nonfinite + 1 if nonfinite else 0
        own = self.own_nonfinite_losses + (not loss_finite) if nonfinite else 0
        self.own_nonfinite_losses = own
        if self.consecutive_nonfinite >= self.config.max_consecutive_nonfinite:
            error = NonFiniteLossError(
                f"{self.consecutive_nonfinite} optimizer steps in a row, the last at step "
                f"{step}, had a non-finite loss or gradient norm; each was skipped, so the "
                "weights are those of the last finite step (and the last checkpoint holds "
                "them). Fix: lower the learning rate, check the data for NaN/inf, or use "
                "bf16/fp32 if this is fp16."
            )
            error.own_loss_nonfinite = own > 0
            raise error
        at_min = overflow and loss_scale is not None and loss_scale <= min_scale
        self.overflows_at_min_scale = self.overflows_at_min_scale + 1 if at_min else 0
        limit = self.config.overflows_at_min_scale_before_fallback
        fall_back = self.config.precision_fallback and self.overflows_at_min_scale >= limit
        if fall_back:
            self.overflows_at_min_scale = 0
        self.streak_open = bool(self.consecutive_nonfinite or self.overflows_at_min_scale)
        return fall_back

    def out_of_memory(self, *, batch_size: int, micro_batch_size: int | None) -> OutOfMemoryError:
        return OutOfMemoryError(
            f"out of memory with micro-batches of {micro_batch_size or batch_size} sample(s) "
            f"(loader batch size {batch_size}); nothing smaller is possible. Fix: enable "
            "gradient checkpointing (torch.utils.checkpoint) in the model, use bf16, or a "
            "smaller model; the last checkpoint is intact."
        )

    def oom_thrashing(self, steps: list[int], sizes: list[int]) -> OutOfMemoryError:
        shown = " -> ".join(str(size) for size in sizes)
        return OutOfMemoryError(
            f"out of memory in {len(steps)} optimizer steps in a row (steps {steps[0]} to "
            f"{steps[-1]}; micro-batches halved to {shown}): memory grows from step to step, "
            "which halving cannot fix. Likely a tensor kept across steps (a loss or output "
            "stored without .detach()/.item()), or a fragmented allocator. Fix: find what "
            "grows (profile_memory_usage), set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, "
            "or raise oom_thrash_steps; the last checkpoint is intact."
        )

    def step_error(
        self,
        exc: BaseException,
        *,
        epoch: int,
        step: int | None,
        batch_index: int | None,
        rank: int,
        timeout_s: float | None,
        phase: str,
        validation: bool = False,
    ) -> BaseException:
        """The error to raise for an exception escaping a step, or a validation (the
        original is chained); it names the user's function the exception escaped from
        (``core.errors.raised_in``), else ``phase``."""
        if isinstance(exc, CoreError):
            return exc
        place = Place(epoch, step, batch_index, validation)
        if is_out_of_memory(exc) and validation:
            return OutOfMemoryError(
                f"rank {rank} ran out of memory in {place}; a validation batch is not "
                "re-split. Fix: a smaller val_loader batch size, bf16, or "
                "activation_checkpointing; the last checkpoint is intact."
            )
        if is_out_of_memory(exc):  # here only where re-splitting is off
            return OutOfMemoryError(
                f"rank {rank} ran out of memory in {place}, and "
                f"oom_recovery={self.config.oom_recovery!r} does not "
                "re-split here ('auto' re-splits in one process only). Fix: "
                "oom_recovery='on' (DDP: ranks agree and halve together), a smaller batch "
                "size or micro_batch_size, bf16, or activation_checkpointing; the last "
                "checkpoint is intact."
            )
        if timeout_s is not None and is_collective_failure(exc):
            return DistributedTimeoutError(
                f"rank {rank}: a collective ({phase}, epoch {epoch}, step {step}) did not "
                f"finish within timeout_s={timeout_s:g}: another rank stopped making progress "
                f"(stuck, crashed or killed). Original error: {str(exc).splitlines()[0]}"
            )
        kept = " The last completed step is checkpointed when checkpointing is on."
        return TrainingStepError(
            f"{raised_in(exc) or phase} failed in {place}: {type(exc).__name__}: {exc}."
            + (kept if step is not None else "")
        )

    def state_dict(self) -> dict[str, Any]:
        return {"consecutive_nonfinite": self.consecutive_nonfinite}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consecutive_nonfinite = int(state["consecutive_nonfinite"])
        self.streak_open = bool(self.consecutive_nonfinite or self.overflows_at_min_scale)
