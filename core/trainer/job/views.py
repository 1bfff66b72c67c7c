"""A job's state and the read-only views of it: where it runs, how far it got, its parts
once built. Under ``run.isolation="process"`` the progress is read from the training
process's records, and ``model`` is the one given, holding the trained weights after ``train()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.checkpointing.lineage import Checkpoints
from core.checkpointing.store import CheckpointStore
from core.config import TrainingConfig
from core.loop.epoch import Scheduler
from core.monitoring.distribution import MonitoredDistribution
from core.precision.policy import PrecisionPolicy
from core.trainer.assembly.build import Parts, Runtime
from core.trainer.job.inspection import checkpoints_of
from core.trainer.process.child_state import ChildState

__all__ = ("JobViews",)


class JobViews:
    """A job's state and its read-only properties (the base of ``TrainingJob``)."""

    def __init__(self, config: TrainingConfig, runtime: Runtime, *, isolated: bool) -> None:
        self._config = config
        self._runtime = runtime
        self._isolated = isolated  # the job trains in another process
        self._parts: Parts | None = None  # once built in this process
        self._run_dir: Path | None = None
        self._child = ChildState()  # an isolated job's progress, read from its records

    @property
    def config(self) -> TrainingConfig:
        return self._config

    @property
    def trains_here(self) -> bool:
        """Whether this process trains the job (not a training process, ranks or Ray actor)."""
        return not self._isolated

    @property
    def rank(self) -> int:
        return 0 if self._isolated else self._built.strategy.rank

    @property
    def world_size(self) -> int:
        if self._isolated:  # devices=N: the ranks train elsewhere
            return self._config.distributed.devices or 1
        return self._built.strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.rank == 0

    @property
    def run_dir(self) -> Path | None:
        """The directory of the current or last run (None before the first)."""
        return self._run_dir

    @property
    def global_step(self) -> int:
        return self._child.global_step if self._isolated else self._built.loop.global_step

    @property
    def epochs_completed(self) -> int:
        if self._isolated:
            return self._child.epochs_completed
        return self._built.state.epochs_completed

    @property
    def last_checkpoint(self) -> str | None:
        """The newest checkpoint this job wrote or resumed from: the last good one."""
        if self._isolated:
            return self._child.last_checkpoint
        return self._built.checkpointer.last_path

    @property
    def checkpoints(self) -> Checkpoints:
        """The checkpoint directory's checkpoints: ``.latest``, ``.best``, ``verify``,
        ``load``, ``lineage`` (``core.checkpointing.lineage``)."""
        if self._isolated:  # written by the training process, read from the directory
            config = self._config
            store = CheckpointStore(config.checkpoint_directory, keep_last_n=1)
            child = self._child
            return Checkpoints(store, lambda: child.best_checkpoint, config.checkpoint.safe_globals)
        return checkpoints_of(self._config, self._built)

    @property
    def strategy_name(self) -> str:
        """How the job is distributed: ``cpu``, ``single_gpu``, ``data_parallel``,
        ``distributed`` (DDP), ``fsdp`` or ``expert_parallel``."""
        return self._built.strategy.name

    @property
    def train_loader(self) -> Iterable[Any]:
        """This rank's training loader (under DDP/FSDP2 re-sharded with a sampler)."""
        return self._built.train_loader

    @property
    def model(self) -> nn.Module:
        """The model as trained (placed, and wrapped by DDP/FSDP2/DataParallel if used)."""
        if self._parts is None and self._isolated:
            return self._runtime.model
        return self._built.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._built.optimizer

    @property
    def scheduler(self) -> Scheduler | None:
        return self._built.scheduler

    @property
    def mixed_precision(self) -> PrecisionPolicy:
        """The precision policy: AMP switches (``enable_amp()``...) and ``get_amp_stats()``."""
        return self._built.policy

    @property
    def distribution(self) -> MonitoredDistribution:
        """Where the job runs (its ``strategy``, ``get_performance_summary()``) and its
        ``gpu_monitor``."""
        return self._built.distribution

    @property
    def _built(self) -> Parts:
        if self._parts is None and self._isolated:
            raise RuntimeError(
                "under isolation='process' the run's parts live in its training process: read "
                "run.model (the trained weights once train() returns), the results, "
                "run.checkpoints, or run.events(); evaluate() and predict() build them here"
            )
        if self._parts is None:
            raise RuntimeError(
                "this run is not built yet: enter it (`async with run:`), `await run.start()`, "
                "or call train()"
            )
        return self._parts
