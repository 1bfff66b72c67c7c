"""What the GPU suite's cases share: the run context, a table row, judging a figure against
its goal, and one training run through ``core`` with its last-epoch throughput and peak memory.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn

from core import Callback, MultiGPUConfig, create_optimized_training_optimizer

__all__ = ("Ctx", "EpochRates", "Row", "core_run", "judged", "namespace", "skipped")


@dataclass(frozen=True)
class Ctx:
    """Where and how a case runs: ``dry_run`` means tiny sizes on any device, goals unjudged.

    >>> Ctx(torch.device("cpu"), True, Path("/tmp")).cuda
    False
    """

    device: torch.device
    dry_run: bool
    tmp: Path

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


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


class EpochRates(Callback):
    """Collects each epoch's ``samples_per_s`` (the first epoch is the warm-up)."""

    def __init__(self) -> None:
        self.rates: list[float] = []

    async def on_epoch_end(self, run: Any, record: dict[str, Any]) -> None:
        rate = record.get("samples_per_s")
        if rate is not None:
            self.rates.append(float(rate))


def core_run(
    ctx: Ctx, model: nn.Module, batches: Sequence[Any], epochs: int = 2, **settings: Any
) -> tuple[float, int | None]:
    """Train ``model`` through ``create_optimized_training_optimizer``: (samples/s of the last
    epoch, the allocator's peak bytes on CUDA, None elsewhere). Monitor, checkpoints,
    progress and reports are off: the figure is the training step.

    >>> core_run(ctx, model, batches, amp_dtype="bf16")  # doctest: +SKIP
    """
    rates = EpochRates()
    if ctx.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
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
        callbacks=[rates],
        **settings,
    )
    anyio.run(optimizer.train)
    optimizer.close()
    peak = torch.cuda.max_memory_allocated() if ctx.cuda else None
    return rates.rates[-1], peak
