"""The facade of the training job: ``create_optimized_training_optimizer`` and
``OptimizedTrainingOptimizer`` (seeds 002 and 004), as in the seed API. The factory's flat
keywords map onto the config tree through ``core.facades.flat``; ``config=`` reaches every
other setting."""

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
    """The :class:`~core.trainer.job.orchestrator.TrainingJob` under the seeds' name (the
    training process of ``run.isolation="process"`` builds this class too)::

        async with OptimizedTrainingOptimizer(config, model=model, train_loader=loader) as run:
            results = await run.train()
    """

    @property
    def multi_gpu_trainer(self) -> MonitoredDistribution:
        """Seed 004's name for :attr:`distribution`."""
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
    """The training job, validated and built, from flat keywords (docs/training.md).

    ``settings`` are flat keywords (``core.facades.flat.FLAT_KEYWORDS``: ``amp_dtype`` is
    ``precision.dtype``) or whole sections (``multi_gpu_config=``...); ``config=`` is the
    base tree. ``optimizer`` and ``scheduler`` are instances or factories (default: AdamW
    with ``learning_rate``, fused where supported); ``loss_fn`` defaults to cross-entropy;
    ``training_step(model, batch)`` returns the loss (or a dict with ``"loss"``).

    Raises :class:`~core.errors.ConfigError` naming the bad argument (a wrong type, a
    ``log_dir`` that cannot be written, a factory that raises, a foreign optimizer, a one-shot
    iterator with ``max_epochs > 1``, what cannot cross into a training process, a setting
    given twice). Inside a running event loop only the cheap checks run here: the build and
    its errors come at ``await run.train()`` (or ``start()``, ``async with``), in a worker
    thread, so the loop's thread stays free.
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
