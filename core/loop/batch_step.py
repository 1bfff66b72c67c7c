"""The optimizer step over one loader batch with one backward: the plain case, where
nothing is called that would do nothing (``core.loop.step`` says which runs take it)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from time import perf_counter
from typing import Any

import torch

from core.hardware.device import device_of
from core.loop.accumulation import Window
from core.loop.readback import Readback
from core.loop.recorder import StepOutcome
from core.loop.retry import LocalRetry
from core.loop.step_function import LoggedValues
from core.loop.window_step import WindowStep
from core.precision.plugins import Precision

__all__ = ("BatchStep",)


class BatchStep:
    """One optimizer step over one loader batch, one backward (module docstring).

    Built only where that is the whole step (:func:`optimizer_step_for`); a batch split
    after an out-of-memory error goes to ``windows``, the :class:`WindowStep` beside it.
    """

    def __init__(self, windows: WindowStep) -> None:
        self.windows = windows
        self.model = windows.model
        self.policy = windows.policy
        self.objective = windows.objective
        self.logs = windows.objective.logs  # a step function's values, packed with the loss
        self.check_loss = windows.errors.check_loss
        self.loss_source = windows.objective.loss_source  # named by a malformed loss
        self.prepare_batch = windows.prepare_batch
        self.update = windows.update
        self.recorder = windows.recorder
        self.accumulation = windows.accumulation
        # Only a retry that runs the batch again (LocalRetry) is told anything: the RNG
        # state before each step.
        retry = windows.retry
        self.retry = retry if isinstance(retry, LocalRetry) else None
        self.rng_state = device_of(windows.device).rng_state
        # What the precision of the step in hand does, bound when it changes (AMP switched
        # on or off, the fp16 fallback): its autocast context and its backward.
        self._precision: Precision | None = None
        self._autocast: AbstractContextManager[Any] = nullcontext()
        self._backward: Callable[[torch.Tensor], None] = torch.Tensor.backward

    def _bind(self, precision: Precision) -> None:
        self._precision = precision
        self._autocast = precision.autocast()
        # A precision whose backward is the plain one (fp32, bf16) is not called for it.
        plain = type(precision).backward is Precision.backward
        self._backward = torch.Tensor.backward if plain else precision.backward

    def __call__(
        self, window: Window, *, step: int, epoch: int, started: float, data_time_s: float
    ) -> None:
        """Optimizer step number ``step`` over ``window`` (one batch)."""
        if self.accumulation.micro_batch_size is not None:  # split since an OOM
            self.windows(window, step=step, epoch=epoch, started=started, data_time_s=data_time_s)
            return
        precision = self.policy.begin_step()  # FP32 | Autocast | ScaledFP16
        if precision is not self._precision:
            self._bind(precision)
        retry = self.retry
        if retry is not None:
            retry.rng = self.rng_state()  # an OOM runs the batch again, split, same draws
        failed = False
        try:
            batch = self.prepare_batch(window.batches[0])
            with self._autocast:
                _, loss = self.objective(self.model, batch)
            loss = self.check_loss(
                loss,
                epoch=epoch,
                batch_index=window.first_batch_index,
                step=step,
                source=self.loss_source,
            )
            self._backward(loss)
        except Exception as exc:
            if retry is None or not retry.recoverable(exc):
                raise
            failed = True  # handled outside ``except``: the traceback holds the memory
        if failed:
            self.windows.recover(window, step, epoch)
            self.windows.train(
                window, precision, step=step, epoch=epoch, started=started, data_time_s=data_time_s
            )
            return
        values = self.objective.logged if self.logs else None
        logged = LoggedValues([(values, window.samples)]) if values else None
        pack = partial(Readback, [loss.detach().float()], window.sizes, logged)
        readback = self.update(precision, pack, before_step=self.recorder.settle)
        self.recorder.pending = StepOutcome(
            readback, epoch, step, window.samples, perf_counter() - started, data_time_s
        )
