"""``TrainingJob``: the async shell of a run, an async resource.

::

    async with TrainingJob(config, model=model, train_loader=loader) as run:
        results = await run.train()

Creating a job checks its arguments, cheaply; entering builds the parts in a worker thread;
leaving releases them. Cancelling ``train()`` in any way stops the run at a step boundary
with its checkpoint, then propagates (docs/checkpoints-and-reliability.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from torch import nn
from typing_extensions import Self, override

from core.callbacks import Callback
from core.config import TrainingConfig
from core.factory import Factory, factory_of
from core.loop.objective import LossFn
from core.loop.step_function import StepFn
from core.metrics import Metric, MetricFn
from core.telemetry.events import EventHub, EventStream
from core.telemetry.run_log import CurrentLog
from core.trainer.assembly.arguments import check_directories, check_runtime
from core.trainer.assembly.build import Parts, Runtime, build
from core.trainer.assembly.optimization import OptimizerArgument, SchedulerArgument
from core.trainer.cluster.connection import require_ray
from core.trainer.epochs.cycle import RunCycle
from core.trainer.job.benchmark import benchmark_performance, optimal_batch_size
from core.trainer.job.inference import evaluate_with, predict_with
from core.trainer.job.inspection import describe
from core.trainer.job.views import JobViews
from core.trainer.process.child_state import ChildState
from core.trainer.process.crossing import Crossing, crossing_for, resolve
from core.trainer.process.ranks import ranks_crossing
from core.trainer.process.supervisor import TrainingProcess
from core.trainer.running.observers import Observers, StepGate, with_default_callbacks
from core.trainer.running.placement import until_released
from core.trainer.running.run import Run
from core.trainer.running.starts import run_starts
from core.trainer.state.results import TrainingResults

if TYPE_CHECKING:
    from core.trainer.cluster.placement import RayRun

__all__ = ("TrainingJob",)


class TrainingJob(JobViews):
    """One training job: its config tree, its runtime objects and, once built, its parts.

    ``optimizer`` is a torch optimizer over ``model``'s parameters or a factory taking the
    parameters (default: AdamW from ``config.optim``); ``scheduler`` a scheduler of that
    optimizer or a factory taking it. ``metrics`` maps names to :class:`~core.metrics.Metric`
    objects or ``(outputs, targets) -> tensor`` callables (``val_<name>`` for ``monitor``).
    ``training_step(model, batch)`` computes the loss in place of ``loss_fn``;
    ``validation_step`` evaluates (default: ``training_step``). Runtime objects may be named
    as ``"package.module:function"`` factories; under ``run.isolation="process"`` or ``"ray"``
    they must pickle, or be such factories.

    Bad arguments raise :class:`~core.errors.ConfigError` here; the directories the run writes
    and what crosses into a training process are checked where the run starts (a worker
    thread), with the same error.
    """

    def __init__(
        self,
        config: TrainingConfig | None = None,
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
    ) -> None:
        config = TrainingConfig() if config is None else config
        if isinstance(config, TrainingConfig):  # a fast_dev_run's one epoch, decided once here
            config = config.for_run()
        given = {
            "model": model,
            "train_loader": train_loader,
            "val_loader": val_loader,
            "loss_fn": loss_fn,
            "optimizer": optimizer,
            "scheduler": scheduler,
            "metrics": metrics,
            "training_step": training_step,
            "validation_step": validation_step,
        }
        runtime = Runtime(
            **{name: resolve(name, value) for name, value in given.items()},
            model_factory=factory_of(model),
        )
        check_runtime(runtime, config, callbacks)
        # Where an isolated job trains: a training process (its ranks), or a Ray actor.
        self._placement: type[TrainingProcess] | type[RayRun] = TrainingProcess
        if config.run.isolation == "ray":
            require_ray()
            from core.trainer.cluster.placement import RayRun  # loaded for Ray runs only

            self._placement = RayRun
        self._crossing = ranks_crossing(config, given) or crossing_for(config, given)
        super().__init__(config, runtime, isolated=self._crossing is not None)
        # run_start's resolved.isolation: a training process adds what crossed, and how
        self.isolation: dict[str, Any] = {"mode": config.run.isolation}
        self._callbacks = with_default_callbacks(callbacks, config)
        self._hub = EventHub()
        self._log = CurrentLog()
        self._cycle: RunCycle | None = None
        self._gate: StepGate | None = None  # waits for the callbacks that steer each step
        self._placed: TrainingProcess | RayRun | None = None
        self._running = False
        self._open_listeners: list[Callable[[Path], None]] = []
        self._held_stop: str | None = None  # requested before this train()'s run existed
        self._stop_target: Callable[[str], None] | None = None  # the run in progress's
        self._checked = False  # the directories and what crosses, where the run starts
        self._build_on_demand = False
        # A part read on the event loop's thread (a run the factory left to build) must wait
        # for a build that start() runs meanwhile, not build a second set of parts.
        self._building = threading.Lock()

    # -- the resource ---------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Check the directories the run writes and build the parts, in a worker thread
        (idempotent; ``train()`` calls it). Isolated, check what crosses and start the fork
        server, or connect to the Ray cluster."""
        if self._isolated:  # the fork server imports torch and core meanwhile
            await anyio.to_thread.run_sync(self._prepare_crossing, limiter=run_starts())
        elif self._parts is None:
            await anyio.to_thread.run_sync(self.build, limiter=run_starts())

    def build(self) -> None:
        """Do what :meth:`start` does in this thread, without starting the fork server."""
        if self._isolated:
            self._check_crossing()
        else:
            self._build_here()

    def build_on_demand(self) -> None:
        """Leave the build to :meth:`start`, ``train()``, or the first read of a part (in the
        reading thread)."""
        self._build_on_demand = True

    def _prepare_crossing(self) -> None:
        self._check_crossing()
        self._placement.prepare(self._config)

    def _check_crossing(self) -> None:
        if not self._checked:
            assert self._crossing is not None
            check_directories(self._config)
            self._crossing.check_objects()
            self._checked = True

    def _build_here(self) -> None:
        with self._building:
            if self._parts is not None:
                return
            check_directories(self._config)
            self._parts = build(
                self._config, self._runtime, emit=self._log.emit, report_error=self._log.error
            )
            self._cycle = RunCycle(self._config, self._parts, self._hub, self._log)
            self._parts.loop.schedule.add(self._cycle)  # validation and checkpoints, when due
            self._gate = StepGate(self._parts.loop, self._log, self._hub)
            self._parts.loop.schedule.add(self._gate)  # after each step, when a callback steers
            if self._parts.monitor is not None:  # the distribution's gpu_monitor reads the run's
                self._parts.distribution.attach_monitor(self._parts.monitor)

    @property
    @override
    def _built(self) -> Parts:
        if self._parts is None and self._build_on_demand and not self._isolated:
            self._build_here()
        return super()._built

    async def aclose(self) -> None:
        """Release the process group this job created (in a worker thread)."""
        await anyio.to_thread.run_sync(self.close)

    def close(self) -> None:
        """Release the process group this job created (call once, after the last train())."""
        if self._parts is not None:
            self._parts.distribution.cleanup()
            if self._parts.monitor is not None:
                self._parts.monitor.close()

    def events(self, capacity: int | None = None) -> EventStream:
        """An async iterator over this run's records, ending after ``run_end``. A consumer more
        than ``capacity`` records behind loses the oldest ones (``stream.dropped``)."""
        return self._hub.subscribe(capacity or self._config.logging.event_buffer_size)

    def describe(self) -> dict[str, Any]:
        """What the config resolved to (as in ``run_start``) and the plan as it stands now."""
        return describe(self._config, self._built) | {"isolation": dict(self.isolation)}

    def request_stop(self, reason: str = "requested by a callback") -> bool:
        """Stop the run in progress at its next step boundary, from the event loop's thread:
        the stop checkpoint is written, ``train()`` returns, ``run_end`` has
        ``status="stopped"`` and ``stop_reason="requested: <reason>"``. A request while
        ``train()`` still starts is held for its first step. False where it will not be
        honoured: no ``train()`` in progress, its ``run_end`` already written (an
        ``on_run_end`` hook), or its training process ended or is cancelled."""
        if not self._running or self._hub.ended:
            return False
        if self._placed is not None:
            return self._placed.request_stop(reason)
        if self._stop_target is None:  # this train()'s run does not exist yet: held for it
            self._held_stop = self._held_stop or reason
            return True
        self._stop_target(reason)
        return True

    # -- using the trained model ----------------------------------------------------------
    async def evaluate(self, loader: Iterable[Any] | None = None) -> dict[str, float | None]:
        """Loss, accuracy and ``metrics=`` over ``loader`` (default: the ``val_loader``); under
        several ranks, call it on every rank.

        ``{"loss": 0.31, "accuracy": 0.9, "f1": 0.88, "samples": 128.0}``: ``samples`` counts
        every rank's (padding a shard adds none); ``accuracy`` is None where it does not apply."""
        parts = await self._idle("evaluate")
        return await anyio.to_thread.run_sync(evaluate_with, parts, loader)

    async def predict(self, loader: Iterable[Any]) -> list[Any]:
        """The model's outputs, one entry per batch of ``loader`` (this rank's shard under
        several ranks), moved to the CPU: ``torch.cat(await run.predict(loader))``."""
        parts = await self._idle("predict")
        return await anyio.to_thread.run_sync(predict_with, parts, loader)

    def benchmark_performance(self, num_iterations: int = 100) -> dict[str, Any]:
        """Average forward, backward and optimizer-step seconds over ``num_iterations`` steps,
        and ``samples_per_second``; training is unaffected. Synchronous: in async code,
        ``await anyio.to_thread.run_sync(run.benchmark_performance, 20)``."""
        parts = self._ready("benchmark_performance")
        return benchmark_performance(parts, self._config, num_iterations)

    def get_optimal_batch_size(self, target_memory_usage: float = 0.8) -> int:
        """The largest batch size within ``target_memory_usage`` of the device's memory (CPU:
        of the available RAM)."""
        parts = self._ready("get_optimal_batch_size")
        return optimal_batch_size(parts, self._config, target_memory_usage)

    def _ready(self, what: str) -> Parts:
        if self._running:
            raise RuntimeError(f"{what}() cannot run while train() runs on this job")
        self._build_here()
        return self._built

    async def _idle(self, what: str) -> Parts:
        if self._running:
            raise RuntimeError(f"{what}() cannot run while train() runs on this job")
        await anyio.to_thread.run_sync(self._build_here)
        return self._built

    # -- the run --------------------------------------------------------------------------
    async def train(self) -> TrainingResults:
        """Run epochs until ``max_epochs``, early stopping, an error, a signal or cancellation."""
        if self._running:
            raise RuntimeError("train() is already running on this job")
        self._running = True
        self._hub.ended = False  # the run_end seen is the earlier train()'s
        try:
            if self._crossing is not None:
                await self.start()  # what crosses is checked off this thread, before a process
                return await self._train_placed(self._crossing)
            run, description = await until_released(self._start_run, dropped=_let_go)
            cycle = self._cycle
            assert cycle is not None
            self._stop_target = cycle.request_stop  # the run's own stop flag exists from here
            assert self._gate is not None
            self._gate.attach(run.observers, cycle.stop)
            if self._held_stop is not None:
                cycle.request_stop(self._held_stop)
            results = await run.execute(description, on_open=self._opened)
            self._run_dir = results.run_dir  # None: a smoke run's directory, removed
            return results
        finally:
            self._running = False
            self._held_stop = None
            self._stop_target = None
            if self._gate is not None:
                self._gate.attach(None, None)

    async def _start_run(self, cancelled: anyio.Event) -> tuple[Run, dict[str, Any]]:
        """A run of this job, made in a worker thread (a cancellation meanwhile drops it:
        :func:`_let_go`)."""
        return await anyio.to_thread.run_sync(
            self._new_run, self._observers(), limiter=run_starts()
        )

    def _new_run(self, observers: Observers) -> tuple[Run, dict[str, Any]]:
        """The parts built (where not yet), a run of them and its description (a worker
        thread's call: a thread started on the event loop's thread blocks it)."""
        self._build_here()
        assert self._cycle is not None
        return Run(self._config, self._built, self._cycle, self._hub, observers), self.describe()

    async def _train_placed(self, crossing: Crossing) -> TrainingResults:
        self._child = ChildState()
        self._placed = child = self._placement(
            type(self),
            self._config,
            crossing,
            model=self._runtime.model,
            hub=self._hub,
            observers=self._observers(),
            state=self._child,
            on_open=self._opened,
        )
        if self._held_stop is not None:  # requested while what crosses was checked
            child.request_stop(self._held_stop)
        try:
            results = await child.execute()
        finally:
            self._placed = None
        self._run_dir = results.run_dir  # None: a smoke run's directory, removed
        return results

    def _observers(self) -> Observers:
        return Observers(
            self._callbacks,
            self,
            report=self._log.error,
            warn=self._log.warning,
            capacity=self._config.logging.event_buffer_size,
            grace_s=self._config.logging.callback_grace_s,
        )

    def when_opened(self, listener: Callable[[Path], None]) -> None:
        """Call ``listener`` with the run's directory as each ``train()`` opens it, before any
        record reaches a callback (an ``on_run_start`` hook may come after a process died)."""
        self._open_listeners.append(listener)

    def _opened(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        for listener in self._open_listeners:
            listener(run_dir)


def _let_go(started: tuple[Run, dict[str, Any]]) -> None:
    """A run a cancellation dropped before it began: its step thread exits."""
    run, _ = started
    run.worker.close()
