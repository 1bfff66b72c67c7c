"""What the GPU suite's cases share: the run context (with the case's deadline), a table row,
judging a figure against its goal, rounds that stop before the deadline, and one training
run through ``core`` with its last-epoch throughput, peak memory and compile record.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn

from core import Callback, MultiGPUConfig, create_optimized_training_optimizer

__all__ = (
    "CaseTimeout",
    "Ctx",
    "CoreRun",
    "Row",
    "RunWatch",
    "core_run",
    "judged",
    "namespace",
    "rounds",
    "skipped",
)

ROUND_MARGIN_S = 3.0  # left after the last round for building rows and freeing memory


class CaseTimeout(Exception):
    """Raised in the main thread when a case spends its time budget (a code path that
    catches a peer's or a run's errors must let it through)."""


@dataclass(frozen=True)
class Ctx:
    """Where and how a case runs: ``dry_run`` means tiny sizes on any device, goals unjudged;
    ``deadline`` is the ``time.monotonic()`` at which the case's budget is spent.

    >>> Ctx(torch.device("cpu"), True, Path("/tmp")).cuda
    False
    """

    device: torch.device
    dry_run: bool
    tmp: Path
    deadline: float = math.inf

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def left(self) -> float:
        """Seconds left of the case's budget."""
        return self.deadline - time.monotonic()


@dataclass
class Row:
    """One line of the table: a figure of a case, its goal and whether it was met.

    ``status``: "pass", "fail", "measured" (no goal), "dry-run" (not judged), "skipped"
    or "error: ...".
    """

    case: str
    figure: str
    value: str
    goal: str = "-"
    status: str = "measured"
    note: str = ""


def judged(
    ctx: Ctx,
    case: str,
    figure: str,
    value: float | None,
    goal: float | None = None,
    unit: str = "",
    note: str = "",
    digits: int = 3,
) -> Row:
    """A row for ``value``, judged ``value >= goal`` (not judged in a dry run or without goal).

    >>> judged(Ctx(torch.device("cuda"), False, Path(".")), "x", "ratio", 1.2, 1.15).status
    'pass'
    """
    shown = "-" if value is None else f"{value:.{digits}f}{unit}"
    goal_text = "-" if goal is None else f">= {goal:g}{unit}"
    if ctx.dry_run:
        status = "dry-run"
    elif goal is None:
        status = "measured"
    elif value is None:
        status = "fail"
    else:
        status = "pass" if value >= goal else "fail"
    return Row(case, figure, shown, goal_text, status, note)


def skipped(case: str, figure: str, reason: str, goal: str = "-") -> Row:
    """A row for a figure this device (or a dry run) cannot measure, with the reason.

    >>> skipped("precision", "fp16", "CUDA only").status
    'skipped'
    """
    return Row(case, figure, "-", goal, "skipped", reason)


def namespace(**values: Any) -> argparse.Namespace:
    """The ``args`` the reused benchmark functions read, built without their parsers.

    >>> namespace(steps=2).steps
    2
    """
    return argparse.Namespace(**values)


def rounds(ctx: Ctx, want: int) -> Iterator[int]:
    """Round numbers 0, 1, ... below ``want`` (one in a dry run). A round after the first
    starts only when the slowest round so far still fits before the case's deadline, so a
    slow device gives fewer rounds instead of a spent budget (the rows say how many ran).

    >>> list(rounds(Ctx(torch.device("cpu"), False, Path(".")), 3))
    [0, 1, 2]
    """
    slowest = 0.0
    for number in range(1 if ctx.dry_run else want):
        if number and ctx.left() < 1.05 * slowest + ROUND_MARGIN_S:
            return
        started = time.monotonic()
        yield number
        slowest = max(slowest, time.monotonic() - started)


class RunWatch(Callback):
    """Collects each epoch's ``samples_per_s`` (the first epoch holds the warm-up and any
    compilation), the ``compile`` record and ``compile_failed`` errors of a run."""

    def __init__(self) -> None:
        self.rates: list[float] = []
        self.compiles: list[dict[str, Any]] = []
        self.compile_errors: list[str] = []

    async def on_record(self, run: Any, record: dict[str, Any]) -> None:
        if record.get("event") == "compile":
            self.compiles.append(record)
        elif record.get("event") == "error" and record.get("kind") == "compile_failed":
            self.compile_errors.append(str(record.get("reason", "")))

    async def on_epoch_end(self, run: Any, record: dict[str, Any]) -> None:
        rate = record.get("samples_per_s")
        if rate is not None:
            self.rates.append(float(rate))


@dataclass
class CoreRun:
    """What :func:`core_run` measured: the last epoch's samples/s, the allocator's peak
    bytes (None off CUDA), and the compile records and failures of the run."""

    rate: float
    peak: int | None
    compiles: list[dict[str, Any]] = field(default_factory=list)
    compile_errors: list[str] = field(default_factory=list)


def core_run(
    ctx: Ctx, model: nn.Module, batches: Sequence[Any], epochs: int = 2, **settings: Any
) -> CoreRun:
    """Train ``model`` through ``create_optimized_training_optimizer`` and measure it.

    Monitor, checkpoints, progress and reports are off: the figure is the training step.
    ``compile=False`` unless ``settings`` say otherwise, so that a case compares like with
    like (core's default has been ``"auto"``, which compiles on CUDA).

    >>> core_run(ctx, model, batches, amp_dtype="bf16").rate  # doctest: +SKIP
    """
    watch = RunWatch()
    if ctx.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    settings = {"compile": False, **settings}
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=batches,
        max_epochs=epochs,
        learning_rate=1e-4,
        log_dir=ctx.tmp,
        experiment_name="gpu_suite",
        checkpoint_every_n_epochs=None,
        multi_gpu_config=MultiGPUConfig(enable_gpu_monitoring=False),
        progress=False,
        reports=False,
        callbacks=[watch],
        **settings,
    )
    try:
        anyio.run(optimizer.train)
    finally:
        optimizer.close()
    peak = torch.cuda.max_memory_allocated() if ctx.cuda else None
    return CoreRun(watch.rates[-1], peak, watch.compiles, watch.compile_errors)
