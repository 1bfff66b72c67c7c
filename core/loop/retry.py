"""What a step does after an out-of-memory error: nothing, retry alone, or retry together.

After an OOM the step frees what it held, halves the micro-batch and runs the window again:
the result is unchanged (the loss weights do not depend on the split) and the random
generators are rewound, so dropout draws the masks a run at the smaller size draws. When
``oom_thrash_steps`` optimizer steps in a row each need a re-split (Composer's rule), memory
grows from step to step and the run stops with :class:`~core.errors.OutOfMemoryError`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.distributed import Strategy
from core.errors import ConfigError
from core.hardware.device import Device
from core.loop.recovery import ErrorHandler, is_out_of_memory

__all__ = ("AgreedRetry", "LocalRetry", "NoRetry", "retry_policy")


class NoRetry:
    """An out-of-memory error ends the step (and the run) like any other error:
    ``oom_recovery="off"``, or several ranks with ``"auto"``."""

    sync_in_backward = True
    """Whether the window's last backward synchronises gradients across ranks."""

    def recoverable(self, exc: BaseException) -> bool:
        return False

    def failed_anywhere(self, failed: bool) -> bool:
        """Whether this micro-batch failed on any rank (the same answer on all ranks)."""
        return failed

    def rewind(self, step: int, micro_batch_size: int) -> None:
        """Put back what the failed attempt changed, before the retry."""

    def average_gradients(self, grads: Sequence[torch.Tensor]) -> None:
        """Synchronise gradients where backward did not (AgreedRetry only)."""


class LocalRetry(NoRetry):
    """Re-split after an OOM in one process (CPU, one GPU, DataParallel) with ``"auto"`` or
    ``"on"``; RNG rewound; thrashing stops the run."""

    def __init__(self, device: Device, errors: ErrorHandler) -> None:
        self.errors = errors
        self.generators = device.generators()
        self.rng: list[torch.Tensor] | None = None
        """The :attr:`generators`' states where the window began (the step notes them), put
        back before a retry."""
        self._streak: list[int] = []  # consecutive steps that needed a re-split
        self._last_oom_step: int | None = None
        self._sizes: list[int] = []

    def recoverable(self, exc: BaseException) -> bool:
        return is_out_of_memory(exc)

    def rewind(self, step: int, micro_batch_size: int) -> None:
        if self.rng is not None:
            for generator, state in zip(self.generators, self.rng, strict=True):
                generator.set_state(state)
        if self._last_oom_step != step:  # the first re-split of this step
            consecutive = self._last_oom_step == step - 1
            self._streak = [*self._streak, step] if consecutive else [step]
            self._last_oom_step = step
            self._sizes.append(micro_batch_size)
            limit = self.errors.config.oom_thrash_steps
            if len(self._streak) >= limit:
                raise self.errors.oom_thrashing(self._streak, self._sizes[-limit:])


class AgreedRetry(LocalRetry):
    """Several ranks (DDP) with ``"on"``: micro-batches run without gradient sync, ranks
    vote after each (a 4-byte all-reduce) so all halve together, and the gradients are
    averaged after, in one bucketed all-reduce no longer overlapped with backward."""

    sync_in_backward = False

    def __init__(self, device: Device, errors: ErrorHandler, strategy: Strategy) -> None:
        super().__init__(device, errors)
        self.strategy = strategy

    def failed_anywhere(self, failed: bool) -> bool:
        return self.strategy.any_rank(failed)  # 4 bytes on the control group

    def average_gradients(self, grads: Sequence[torch.Tensor]) -> None:
        self.strategy.average_gradients(grads)


def retry_policy(strategy: Strategy, device: Device, errors: ErrorHandler) -> NoRetry:
    """The policy for ``errors.config.oom_recovery`` on ``strategy``."""
    setting = errors.config.oom_recovery
    if setting == "off" or (strategy.world_size > 1 and setting == "auto"):
        return NoRetry()
    if strategy.world_size == 1:
        return LocalRetry(device, errors)
    if not strategy.can_agree_on_oom:
        raise ConfigError(
            f"oom_recovery='on' is not supported with training_mode={strategy.name!r}: FSDP2 "
            "gathers parameters block by block, so a rank that runs out of memory leaves the "
            "others waiting in a collective before the ranks could agree. Allowed: 'on' with "
            "DDP or one process, 'auto' or 'off' here. Fix: oom_recovery='auto', and lower "
            "micro_batch_size or enable activation_checkpointing."
        )
    return AgreedRetry(device, errors, strategy)
