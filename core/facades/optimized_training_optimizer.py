"""The facade of the training job: ``create_optimized_training_optimizer`` and
``OptimizedTrainingOptimizer`` (seeds 002 and 004), as in the seed API::

    from core.optimized_training_optimizer import create_optimized_training_optimizer

    run = create_optimized_training_optimizer(
        model=model, train_loader=train_loader, val_loader=val_loader, max_epochs=3
    )
    results = await run.train()

The factory is an adapter: its flat keywords map onto the config tree through one table
(``core.facades.flat``), ``config=`` reaches every other setting, and the same setting given twice
raises :class:`~core.errors.ConfigError` naming both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch import nn
from typing_extensions import Unpack

from core.callbacks import Callback
from core.config import TrainingConfig
from core.facades.flat import FlatSettings, config_from_flat
from core.facades.integrated.sync import running_event_loop
from core.factory import Factory
from core.loop.objective import LossFn
from core.loop.step_function import StepFn
from core.metrics import Metric, MetricFn
from core.monitoring.distribution import MonitoredDistribution
from core.trainer.assembly.arguments import check_parts
from core.trainer.assembly.optimization import OptimizerArgument, SchedulerArgument
from core.trainer.job.orchestrator import TrainingJob

__all__ = ("OptimizedTrainingOptimizer", "create_optimized_training_optimizer")


class OptimizedTrainingOptimizer(TrainingJob):
    """The training job under the name seeds 002 and 004 give it: a
    :class:`~core.trainer.job.orchestrator.TrainingJob` (the same constructor, async resource,
    methods and views), built from the config tree::

        async with OptimizedTrainingOptimizer(config, model=model, train_loader=loader) as run:
            results = await run.train()

    :func:`create_optimized_training_optimizer` builds one from flat keywords. Under
    ``run.isolation="process"`` the training process builds this class too.
    """

    @property
    def multi_gpu_trainer(self) -> MonitoredDistribution:
        """Seed 004's name for :attr:`distribution`: where the job runs (its ``strategy``,
        ``get_performance_summary()``) and its ``gpu_monitor``."""
        return self.distribution


def create_optimized_training_optimizer(
    *,
    model: nn.Module | str | Factory,
    train_loader: Iterable[Any] | str | Factory,
    val_loader: Iterable[Any] | str | Factory | None = None,
    loss_fn: LossFn | str | None = None,
    optimizer: OptimizerArgument | str | None = None,
    scheduler: SchedulerArgument | str | None = None,
    callbacks: Sequence[Callback] = (),
    metrics: Mapping[str, Metric | MetricFn] | None = None,
    training_step: StepFn | str | None = None,
    validation_step: StepFn | str | None = None,
    config: TrainingConfig | None = None,
    **settings: Unpack[FlatSettings],
) -> OptimizedTrainingOptimizer:
    """Validate every argument, build the parts and return the orchestrator, ready to train
    (inside a running event loop, the build is left to the run's start: see below).

    ``settings`` are flat keywords, each one leaf of the config tree (``max_epochs`` is
    ``run.max_epochs``, ``amp_dtype`` is ``precision.dtype``, ``keep_last_n`` is
    ``checkpoint.keep_last_n``; the table is ``core.facades.flat.FLAT_KEYWORDS``), or whole sections
    (``multi_gpu_config=``, ``gradient_accumulation_config=``, ``error_handler_config=``,
    ``mixed_precision_config=``, ``checkpoint_config=``). ``config=`` is the base tree.

    ``optimizer`` is a torch optimizer over ``model.parameters()`` or a factory taking the
    parameters (default: AdamW with ``learning_rate`` and ``weight_decay``, fused where
    supported); ``scheduler`` a scheduler of that optimizer or a factory taking it, stepped
    once per applied optimizer step. ``loss_fn`` defaults to ``CrossEntropyLoss()``; dict
    batches use the model's own loss. ``resume="auto"`` continues from the newest valid
    checkpoint of the experiment. ``metrics`` maps names to :class:`~core.metrics.Metric`
    objects or ``(outputs, targets) -> tensor`` callables, computed at every validation.
    ``training_step(model, batch)`` returns the loss (or a dict with ``"loss"`` and values to
    log) in place of ``loss_fn``; ``validation_step`` evaluates (default: the same).

    A bad argument raises :class:`~core.errors.ConfigError` here, naming it: wrong types
    (``True`` is not a number, ``'no'`` not a flag), a ``log_dir`` that cannot be created or
    written, a factory that raises, an optimizer over parameters that are not the model's,
    a ``ReduceLROnPlateau`` whose ``mode`` is not the monitored value's, a one-shot iterator as a
    loader when ``max_epochs > 1``, an object that cannot cross into the training process
    (``isolation="process"``), and a setting given twice. Loaders without ``len()`` (a
    DataLoader over an ``IterableDataset``) are streamed.

    Called inside a running event loop (a service's handler, ``async def main``), it does
    only the cheap checks there and returns the run unbuilt: building (hashing the weights,
    placing the model, the directories' probe files, pickling what crosses) is left to
    ``await run.train()`` (or ``await run.start()``, ``async with run:``), which does it in a
    worker thread, so the loop's thread stays free. The errors of that work (a ``log_dir``
    that cannot be written, a factory that raises, what does not pickle) are raised there,
    with the same message. Reading a part first (``run.optimizer``) builds it then, on the
    reading thread.
    """
    check_parts(settings)
    job = OptimizedTrainingOptimizer(
        config_from_flat(settings, config),
        model=model,
        train_loader=train_loader,
        val_loader=val_loader,
        loss_fn=loss_fn,
        optimizer=optimizer,
        scheduler=scheduler,
        callbacks=callbacks,
        metrics=metrics,
        training_step=training_step,
        validation_step=validation_step,
    )
    if running_event_loop() is None:
        job.build()  # a synchronous caller gets the run built, and its errors here
    else:  # the loop's thread stays free: train() builds in a worker thread
        job.build_on_demand()
    return job
