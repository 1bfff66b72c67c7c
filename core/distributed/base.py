"""The interface every distribution strategy fulfils, implemented for one process.

The step loop talks to a strategy only through these methods, so it never asks which
strategy it has. The base class is the single-process, single-device behaviour: no
wrapping, no samplers, no collectives; a subclass overrides only what differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer

from core.distributed.lockstep import Lockstep
from core.distributed.outcome import RankOutcome
from core.hardware.device import device_of

__all__ = ("Strategy",)

T = TypeVar("T")

_NO_CONTEXT = nullcontext()  # re-entrant and reusable: one for every micro-batch


class Strategy:
    """Single process on one device (CPU, one GPU, or any other torch device)."""

    def __init__(self, device: torch.device, name: str | None = None) -> None:
        self.device = device
        self.name = name or ("single_gpu" if device_of(device).is_cuda else device.type)

    # -- identity -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_global_zero(self) -> bool:
        return self.rank == 0

    def describe(self) -> dict[str, Any]:
        """What the strategy is, for ``run_start`` and ``get_training_info()``."""
        return {
            "training_mode": self.name,
            "device": str(self.device),
            "world_size": self.world_size,
            "rank": self.rank,
            "local_rank": self.local_rank,
        }

    def device_indices(self) -> list[int]:
        """The CUDA devices this process drives (for the monitor); empty off CUDA."""
        return device_of(self.device).indices()

    # -- lifecycle ------------------------------------------------------------------------
    def setup(self) -> None:
        """Bring up what the strategy needs (a process group, the current CUDA device)."""
        device_of(self.device).make_current()

    def teardown(self) -> None:
        """Release what :meth:`setup` created, and nothing else."""

    # -- model and data -------------------------------------------------------------------
    def wrap_model(
        self, model: nn.Module, *, compute_dtype: torch.dtype = torch.float32
    ) -> nn.Module:
        """Place (and wrap) the model; ``compute_dtype`` is the precision's autocast dtype."""
        return model.to(self.device)

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever wrapper :meth:`wrap_model` added."""
        return model

    def prepare_loader(self, loader: Iterable[Any], *, train: bool) -> Iterable[Any]:
        return loader

    def lockstep(self, loader: Iterable[Any], name: str, *, epoch: int | None = None) -> Lockstep:
        """How the ranks end an epoch of ``loader`` together (``name`` for the error);
        raises :class:`~core.errors.UnevenLoadersError` where ranks' lengths differ."""
        return Lockstep()

    def eval_sample_limit(self, loader: Iterable[Any]) -> int | None:
        """How many leading samples of ``loader`` are real (the rest pad a shard), or None."""
        return None

    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The full (unsharded) model state; under FSDP2 a collective, filled on rank 0."""
        return self.unwrap(model).state_dict()

    # -- checkpoints ----------------------------------------------------------------------
    def checkpoint_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
        """Model and optimizer state to store in ``state.pt`` (rank 0's, for replicas)."""
        return {"model": self.unwrap(model).state_dict(), "optimizer": optimizer.state_dict()}

    def save_sharded(self, model: nn.Module, optimizer: Optimizer, path: Path) -> None:
        """Write sharded state with torch.distributed.checkpoint (FSDP2 only)."""

    def load_checkpoint_state(
        self, model: nn.Module, optimizer: Optimizer, payload: dict[str, Any], sharded: Path
    ) -> None:
        """Restore what :meth:`checkpoint_state` (or :meth:`save_sharded`) stored."""
        self.unwrap(model).load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])

    def set_epoch(self, loader: Iterable[Any], epoch: int) -> None:
        """Tell the loader's sampler which epoch starts (for a distinct shuffle per epoch)."""
        sampler = getattr(loader, "sampler", None)
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    # -- the step -------------------------------------------------------------------------
    def no_backward_sync(self, model: nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        """The context a micro-batch's forward and backward run in; with ``enabled`` its
        backward does not synchronise gradients across ranks (all but a window's last)."""
        return _NO_CONTEXT

    def window_normaliser(
        self, local: float | torch.Tensor, *, exact: bool = False
    ) -> float | torch.Tensor:
        """The divisor of a micro-batch's ``loss * count`` so gradients average correctly:
        the window's count over all ranks divided by the world size (averaging gradients
        divides by it again). ``exact`` counts even where shards hold equal windows (token
        counts differ between equal-sized windows)."""
        return local if isinstance(local, torch.Tensor) else float(local)

    # -- out-of-memory agreement ------------------------------------------------------------
    can_agree_on_oom = True
    """Whether ranks can re-split together after an out-of-memory error: every micro-batch
    runs without gradient sync, ranks vote, then :meth:`average_gradients` syncs."""

    def average_gradients(self, grads: Sequence[torch.Tensor]) -> None:
        """Average ``grads`` over ranks in place (where backward did not synchronise)."""

    def total_norm(self, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        """The global 2-norm of all gradients (a device tensor; no host sync)."""
        return torch.nn.utils.get_total_norm(grads, norm_type=2.0)

    def reduce_found_inf(self, found_inf: torch.Tensor | None) -> torch.Tensor | None:
        """Combine overflow flags over ranks (needed where ranks hold different shards);
        None (no loss scaling) stays None."""
        return found_inf

    # -- agreement between ranks (immediate in one process) -------------------------------
    stop_vote_interval: int | None = None
    """Every how many optimizer steps the ranks vote on stopping (:meth:`vote_on_stop`);
    None in one process, which stops at the first step boundary after its stop flag is set."""

    @property
    def equal_windows(self) -> bool:
        """Whether every rank's optimizer step holds as many samples (always in one process;
        shards ``core`` built), so no step needs the ranks' sample count."""
        return True

    def should_stop(self, requested: bool) -> bool:
        """Called at every batch boundary (evaluation, prediction) with this rank's wish;
        True when all must stop."""
        return requested

    def vote_on_stop(self, requested: bool) -> bool:
        """The step loop's vote, every :attr:`stop_vote_interval` steps: True when all ranks
        must stop now (one process: its own wish)."""
        return requested

    def settle_stop_votes(self) -> bool:
        """Finish any vote still in flight (end of a phase); True if it said stop."""
        return False

    # -- collectives (identity in one process) --------------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def any_rank(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank."""
        return flag

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's value of ``obj`` on every rank."""
        return obj

    def gather_object(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on rank 0 (others get an empty list)."""
        return [obj]

    def exchange_outcomes(self, mine: RankOutcome, timeout_s: float) -> list[RankOutcome]:
        """Every rank's end of the run (``core.distributed.outcome``); one process: its own."""
        return [mine]

    def barrier(self) -> None:
        """Wait for every rank."""
