"""Epochs of per-batch steps (seed 002's ``MixedPrecisionOptimizer``): ``train_epoch``
drives :class:`~core.facades.eager.steps.EagerSteps` over a loader, ``validate_epoch`` is the run's
own evaluation (``core.loop.evaluation``), and a history of both is kept."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from time import perf_counter
from typing import Any

from core.errors import EmptyLoaderError
from core.facades.eager.steps import EagerSteps
from core.hardware.device import device_of
from core.loop.evaluation import evaluate

__all__ = ("EagerEpochs",)


class EagerEpochs:
    """Train and validate whole epochs through one :class:`EagerSteps`; ``clear_cache``
    empties the CUDA cache after each, ``log_amp_stats`` adds ``amp`` to each epoch's result."""

    def __init__(self, steps: EagerSteps, *, clear_cache: bool, log_amp_stats: bool) -> None:
        self.steps = steps
        self.clear_cache = clear_cache
        self.log_amp_stats = log_amp_stats
        self.epoch = 0
        self.history: list[dict[str, Any]] = []
        self.validations: list[dict[str, Any]] = []

    def train_epoch(self, loader: Iterable[Any]) -> dict[str, Any]:
        """One optimizer step per batch of ``loader``; the epoch's ``loss`` (sample-weighted),
        ``accuracy``, ``steps``, ``skipped_steps``, ``samples``, ``time``, ``samples_per_s``."""
        steps = self.steps
        steps.begin_epoch(self.epoch)
        started = perf_counter()
        for batch in loader:
            steps.train_step(batch)
        elapsed = perf_counter() - started
        stats = steps.stats
        if stats.steps == 0:
            raise EmptyLoaderError(
                f"the loader yielded no batch in epoch {self.epoch}; allowed: a loader with at "
                "least one batch. Fix: check the dataset length and drop_last."
            )
        result: dict[str, Any] = {
            "epoch": self.epoch,
            "loss": stats.loss,
            "accuracy": steps.correct / steps.counted if steps.counted else None,
            "steps": stats.steps,
            "skipped_steps": stats.skipped_steps,
            "samples": stats.samples,
            "time": elapsed,
            "samples_per_s": stats.samples / elapsed if elapsed else None,
        }
        if self.log_amp_stats:
            result["amp"] = steps.policy.get_amp_stats()
        self._after()
        self.history.append(result)
        self.epoch += 1
        return result

    def validate_epoch(self, loader: Iterable[Any]) -> dict[str, Any]:
        """``loss``, ``accuracy`` and ``samples`` of ``loader`` under the current precision."""
        steps = self.steps
        epoch = max(self.epoch - 1, 0)  # the epoch just trained
        was_training = steps.model.training
        started = perf_counter()
        try:
            stats = evaluate(
                steps.model,
                loader,
                epoch=epoch,
                stop=threading.Event(),
                precision=steps.current_precision(),
                strategy=steps.strategy,
                objective=steps.objective.base,
                errors=steps.errors,
            )
        finally:
            steps.model.train(was_training)
        result = {
            "epoch": epoch,
            "loss": stats.loss,
            "accuracy": stats.accuracy,
            "samples": stats.samples,
            "time": perf_counter() - started,
        }
        self._after()
        self.validations.append(result)
        return result

    def _after(self) -> None:
        if self.clear_cache:
            device_of(self.steps.device).empty_cache()  # a device sync, once per epoch

    def training_stats(self) -> dict[str, Any]:
        """Every epoch's and validation's result so far, and the AMP statistics."""
        return {
            "epochs": list(self.history),
            "validations": list(self.validations),
            "amp": self.steps.policy.get_amp_stats(),
        }
