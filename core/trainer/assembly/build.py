"""The composition root: a config tree and the runtime objects in, the run's parts out.

One function, one fixed order (strategy, device settings, precision, model transforms, model
wrap, optimizer and scheduler on the wrapped parameters, loaders, step loop, run state,
checkpointer, monitor), run off the event loop; on failure, what was set up is torn down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch._dynamo  # (see below)
from torch import nn

from core.checkpointing.checkpointer import Checkpointer
from core.checkpointing.disabled import NoCheckpoints
from core.config import TrainingConfig
from core.console.model_summary import summarize_model
from core.data.prefetch import prefetch_to_device
from core.data.rebuild import rebuild_loader
from core.distributed.base import Strategy
from core.distributed.lockstep import batches_in
from core.factory import Factory
from core.hardware.settings import DeviceManager
from core.loop.accumulation import Accumulation
from core.loop.epoch import Scheduler, StepLoop
from core.loop.limit import limit_batches
from core.loop.objective import LossFn, Objective
from core.loop.recovery import ErrorHandler
from core.loop.step import build_step
from core.loop.step_function import StepFn, objective_for
from core.memory.amp_savings import measure_amp_savings
from core.metrics import MetricSet
from core.moe import MoEProbe
from core.monitoring.distribution import MonitoredDistribution
from core.monitoring.gpu_monitor import GPUMonitor
from core.precision.compatibility import check_amp_compatibility
from core.precision.policy import PrecisionPolicy
from core.stopping.early_stopping import EarlyStopping, watched
from core.telemetry.describe import fingerprint
from core.telemetry.init_hash import weights_hash
from core.telemetry.profiler import StepProfiler
from core.trainer.assembly.model_setup import (
    PreparedModel,
    compile_rule_for,
    first_batch,
    prepare_model,
)
from core.trainer.assembly.optimization import (
    OptimizerArgument,
    SchedulerArgument,
    optimizer_for,
    plateau_of,
    scheduler_for,
    trial_optimizer,
)
from core.trainer.state.run_state import RunState

__all__ = ("Parts", "Runtime", "build")

# torch imports its compiler stack (torch._dynamo) when a process builds its first optimizer
# (torch 2.13: any optimizer; ~0.8 s on a 2-core VM) and holds the GIL meanwhile, so an event
# loop stalls even when the build runs in a worker thread. Imported with core (above), it is
# paid at the application's start, not in a running loop: most of `import core` after torch.

Emit = Callable[..., None]


@dataclass(frozen=True)
class Runtime:
    """The objects a run is given, outside the config tree (checked at creation)."""

    model: nn.Module
    train_loader: Iterable[Any]
    val_loader: Iterable[Any] | None = None
    loss_fn: LossFn | None = None
    optimizer: OptimizerArgument | None = None
    scheduler: SchedulerArgument | None = None
    metrics: Mapping[str, Any] | None = None
    training_step: StepFn | None = None
    validation_step: StepFn | None = None
    model_factory: Factory | None = None  # a named model's factory, in every checkpoint


@dataclass(frozen=True)
class Parts:
    """Everything a run is made of, built once by :func:`build`."""

    distribution: MonitoredDistribution
    strategy: Strategy
    device_settings: dict[str, Any]
    policy: PrecisionPolicy
    prepared: PreparedModel
    accumulation: Accumulation
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Scheduler | None
    plateau: Scheduler | None  # the scheduler again where it steps with the monitored value
    objective: Objective
    errors: ErrorHandler
    train_loader: Iterable[Any]
    val_loader: Iterable[Any] | None
    loaders: dict[str, Any]  # what rebuild_loader applied to each, for run_start
    early_stopping: EarlyStopping
    loop: StepLoop
    state: RunState
    checkpointer: Checkpointer
    monitor: GPUMonitor | None
    metrics: MetricSet | None
    model_summary: dict[str, Any]
    init_hash: str
    profiler: StepProfiler | None


def build(
    config: TrainingConfig,
    runtime: Runtime,
    *,
    emit: Emit,
    report_error: Emit,
) -> Parts:
    """Build the parts of a run; ``emit``/``report_error`` write to the current run's log."""
    distribution = MonitoredDistribution(
        config.distributed,
        use_distributed_sampler=config.data.use_distributed_sampler,
        seed=config.run.seed or 0,
    )
    distribution.setup()
    try:
        return _build(config, runtime, distribution, emit, report_error)
    except BaseException:
        distribution.cleanup()
        raise


def _build(
    config: TrainingConfig,
    runtime: Runtime,
    distribution: MonitoredDistribution,
    emit: Emit,
    report_error: Emit,
) -> Parts:
    strategy = distribution.strategy
    device_settings = DeviceManager(config.hardware, strategy.device).apply()
    policy = PrecisionPolicy(config.precision, strategy.device)
    if config.precision.check_compatibility:  # an amp_compatibility record in each run
        policy.compatibility = check_amp_compatibility(
            runtime.model,
            device=strategy.device,
            dtype=policy.amp_precision.dtype,
            loss_scaling=config.precision.enable_grad_scaler,
        )
    objective = objective_for(runtime.loss_fn, runtime.training_step, runtime.validation_step)
    model_summary, init_hash = summarize_model(runtime.model), weights_hash(runtime.model)
    prepared = prepare_model(
        runtime.model,
        config,
        strategy=strategy,
        precision=policy,
        objective=objective,
        train_loader=runtime.train_loader,
        optimizer_factory=trial_optimizer(runtime.optimizer),
        emit=emit,
        report_error=report_error,
    )
    model = distribution.initialize_training(runtime.model, policy.amp_precision.dtype)
    optimizer = optimizer_for(runtime.optimizer, model, config)
    scheduler = scheduler_for(runtime.scheduler, optimizer)
    watching, mode = watched(config, runtime.val_loader is not None)
    plateau = plateau_of(scheduler, watching, mode)  # stepped after each check, not per step
    accumulation = Accumulation(
        replace(config.accumulation, micro_batch_size=prepared.micro_batch_size)
    )
    errors = ErrorHandler(config.errors)
    if config.precision.track_memory_usage:
        policy.note_memory_savings(
            *_amp_memory(runtime, strategy, model, objective, policy, prepared)
        )
    given_train, val_loader, loaders = _with_loader_settings(runtime, config, strategy)
    sharded = distribution.prepare_loader(given_train, train=True)
    train_loader = limit_batches(sharded, config.run.limit_train_batches, "limit_train_batches")
    # Copied ahead on a side CUDA stream where device_prefetch says, the limit inside (it never
    # reads past it); a stream stays as given (the ranks' lockstep must see it as a stream).
    if batches_in(train_loader) is not None:
        train_loader = prefetch_to_device(train_loader, strategy.device, config.data.loader)
    if val_loader is not None:
        val_loader = distribution.prepare_loader(val_loader, train=False)
    monitor = (
        GPUMonitor(config.monitor, device_indices=strategy.device_indices() or None, emit=emit)
        if config.monitoring_enabled
        else None
    )
    steps = config.logging.profile_steps
    profiler = (  # rank 0 traces: the ranks share the run directory
        StepProfiler(*steps, emit=emit) if steps is not None and strategy.is_global_zero else None
    )
    compile_rule, prepared = compile_rule_for(
        config, prepared, strategy.unwrap(model), batches_in(train_loader), emit, report_error
    )
    hooks = [hook for hook in (profiler, compile_rule) if hook is not None]
    loop = StepLoop(
        build_step(
            model=model,
            optimizer=optimizer,
            policy=policy,
            strategy=strategy,
            objective=objective,
            errors=errors,
            optim=config.optim,
            emit=emit,
            scheduler=None if plateau else scheduler,
            accumulation=accumulation,
            device_fields=monitor,
            prepare_batch=prepared.prepare_batch,
            terms=MoEProbe.of(strategy.unwrap(model)),
            step_accuracy=config.logging.step_accuracy,
        ),
        step_hooks=hooks,
        max_steps=config.run.max_steps,
    )
    early_stopping = EarlyStopping(config.early_stopping, mode=mode, monitor=watching)
    state = RunState(
        loop=loop,
        mixed_precision=policy,
        accumulation=accumulation,
        scheduler=scheduler,
        early_stopping=early_stopping,
        errors=errors,
        fingerprint=fingerprint(
            model=strategy.unwrap(model),
            optimizer=optimizer,
            scheduler=scheduler,
            precision=policy.configured_precision,
            accumulation_steps=config.accumulation.accumulation_steps,
            world_size=strategy.world_size,
            train_loader=train_loader,
            seed=config.run.seed,
        ),
        max_epochs=config.run.max_epochs,
        max_steps=config.run.max_steps,
        train_loader=train_loader,
    )
    # A fast_dev_run leaves nothing to resume: its checkpointer writes and reads none.
    checkpointer = (NoCheckpoints if config.run.fast_dev_run else Checkpointer)(
        config.checkpoint,
        config.checkpoint_directory,
        strategy=strategy,
        model=model,
        optimizer=optimizer,
        state=state,
        emit=emit,
        report_error=report_error,
        model_factory=runtime.model_factory,
    )
    return Parts(
        distribution=distribution,
        strategy=strategy,
        device_settings=device_settings,
        policy=policy,
        prepared=prepared,
        accumulation=accumulation,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        plateau=plateau,
        objective=objective,
        errors=errors,
        train_loader=train_loader,
        val_loader=val_loader,
        loaders=loaders,
        early_stopping=early_stopping,
        loop=loop,
        state=state,
        checkpointer=checkpointer,
        monitor=monitor,
        metrics=None if runtime.metrics is None else MetricSet(runtime.metrics),
        model_summary=model_summary,
        init_hash=init_hash,
        profiler=profiler,
    )


def _with_loader_settings(
    runtime: Runtime, config: TrainingConfig, strategy: Strategy
) -> tuple[Iterable[Any], Iterable[Any] | None, dict[str, Any]]:
    """The run's train and val loaders, rebuilt with ``data.loader``'s workers where that is
    safe (``data.rebuild_loaders``), and what was applied to each (``run_start``'s
    ``loaders``)."""

    def rebuilt(loader: Iterable[Any]) -> tuple[Iterable[Any], dict[str, Any]]:
        if not config.data.rebuild_loaders:
            return loader, {"rebuilt": False, "reason": "data.rebuild_loaders=False"}
        return rebuild_loader(
            loader,
            config.data.loader,
            device=strategy.device,
            world_size=strategy.world_size,  # the ranks share this machine's cores
        )

    train, train_applied = rebuilt(runtime.train_loader)
    if runtime.val_loader is None:
        return train, None, {"train": train_applied, "val": None}
    val, val_applied = rebuilt(runtime.val_loader)
    return train, val, {"train": train_applied, "val": val_applied}


def _amp_memory(
    runtime: Runtime,
    strategy: Strategy,
    model: nn.Module,
    objective: Objective,
    precision: PrecisionPolicy,
    prepared: PreparedModel,
) -> tuple[int | None, str]:
    """AMP's peak-memory saving on the train loader's first batch (``track_memory_usage``)."""
    if strategy.world_size > 1:
        return None, "not measured: under several ranks a backward runs their collectives"
    if batches_in(runtime.train_loader) is None:
        return None, "not measured: the train loader is a stream (a batch drawn would be lost)"
    return measure_amp_savings(
        strategy.unwrap(model),
        first_batch(runtime.train_loader),
        objective=objective,
        precision=precision.amp_precision,
        device=strategy.device,
        prepare_batch=prepared.prepare_batch,
    )
