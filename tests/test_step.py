"""The step loop driven directly: gradient-sync boundary, lagged readback, constructor wiring."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from core.config import OptimConfig
from core.distributed import Strategy
from core.hardware.device import device_of
from core.loop.accumulation import Accumulation, GradientAccumulationConfig
from core.loop.epoch import StepLoop
from core.loop.objective import DefaultObjective
from core.loop.recorder import NOTHING_PENDING, Readback, StepOutcome, StepRecorder
from core.loop.recovery import ErrorHandler
from core.loop.schedule import StepSchedule, next_multiple
from core.loop.step import build_step
from core.precision.config import MixedPrecisionConfig
from core.precision.policy import PrecisionPolicy
from tests.helpers import make_classification, make_model

CPU = torch.device("cpu")


class SyncRecordingStrategy(Strategy):
    """One process; remembers whether each micro-batch asked to skip gradient sync."""

    def __init__(self) -> None:
        super().__init__(CPU)
        self.skips: list[bool] = []

    def no_backward_sync(self, model: nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        self.skips.append(enabled)
        return nullcontext()


class LoggingObjective(DefaultObjective):
    """Writes ``("loss", n)`` to ``log`` for every forward pass; inf loss on ``bad`` calls."""

    def __init__(self, log: list[tuple[str, Any]], bad: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.log, self.bad, self.calls = log, bad, 0

    def __call__(self, model: nn.Module, batch: Any) -> tuple[Any, Any]:
        self.calls += 1
        self.log.append(("loss", self.calls))
        outputs, loss = super().__call__(model, batch)
        return outputs, loss * float("inf") if self.calls in self.bad else loss


class LoggingScheduler:
    def __init__(self, optimizer: torch.optim.Optimizer, log: list[tuple[str, Any]]) -> None:
        self.optimizer, self.log = optimizer, log

    def step(self) -> None:
        self.log.append(("scheduler", None))
        for group in self.optimizer.param_groups:
            group["lr"] *= 0.5


def make_loop(
    *,
    batches: int = 3,
    accumulation_steps: int = 1,
    strategy: Strategy | None = None,
    log: list[tuple[str, Any]] | None = None,
    bad: frozenset[int] = frozenset(),
    step_hooks: Sequence[Callable[[int], None]] = (),
    **wiring: Any,
) -> tuple[StepLoop, DataLoader[Any], list[dict[str, Any]]]:
    log = [] if log is None else log
    records: list[dict[str, Any]] = []

    def emit(event: str, **fields: Any) -> None:
        records.append({"event": event, **fields})
        log.append((event, fields.get("step")))

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = build_step(
        model=model,
        optimizer=optimizer,
        scheduler=LoggingScheduler(optimizer, log),
        policy=PrecisionPolicy(MixedPrecisionConfig(dtype="fp32"), CPU),
        accumulation=Accumulation(GradientAccumulationConfig(accumulation_steps)),
        strategy=strategy or Strategy(CPU),
        objective=LoggingObjective(log, bad),
        errors=ErrorHandler(),
        optim=OptimConfig(max_grad_norm=1.0),
        emit=emit,
        **wiring,
    )
    loop = StepLoop(step, step_hooks=step_hooks)
    return loop, DataLoader(make_classification(8 * batches), batch_size=8), records


def run_epoch(loop: StepLoop, loader: DataLoader[Any]) -> None:
    loop.run_epoch(loader, 0, threading.Event())


def test_only_the_last_micro_batch_of_a_window_syncs_gradients() -> None:
    strategy = SyncRecordingStrategy()
    loop, loader, _ = make_loop(batches=6, accumulation_steps=4, strategy=strategy)
    run_epoch(loop, loader)
    assert strategy.skips == [True, True, True, False, True, False]  # windows of 4 and 2


def test_step_n_is_read_back_after_step_n_plus_1_forward_and_before_its_update() -> None:
    log: list[tuple[str, Any]] = []
    loop, loader, records = make_loop(log=log)
    run_epoch(loop, loader)
    assert log == [
        ("loss", 1),
        ("loss", 2),
        ("scheduler", None),
        ("train_step", 1),
        ("loss", 3),
        ("scheduler", None),
        ("train_step", 2),
        ("scheduler", None),
        ("train_step", 3),  # the epoch's end settles the last step
    ]
    # Each step ran at the LR the scheduler set after the step before it.
    assert [r["lr"] for r in records] == [0.1, 0.05, 0.025]


def test_a_skipped_step_does_not_step_the_scheduler() -> None:
    log: list[tuple[str, Any]] = []
    loop, loader, records = make_loop(batches=4, log=log, bad=frozenset({2}))
    run_epoch(loop, loader)
    assert [r["skipped"] for r in records if r["event"] == "train_step"] == [
        False,
        True,
        False,
        False,
    ]
    assert [r["lr"] for r in records if r["event"] == "train_step"] == [0.1, 0.05, 0.05, 0.025]
    assert [e for e, _ in log].count("scheduler") == 3
    assert [r["step"] for r in records if r["event"] == "nonfinite_skipped"] == [2]


def test_step_hooks_and_device_fields_are_constructor_arguments() -> None:
    seen: list[int] = []
    fields = {"device_util_pct": 42.0, "device_mem_used_bytes": 7}
    loop, loader, records = make_loop(
        step_hooks=[seen.append], device_fields=SimpleNamespace(record_fields=fields)
    )
    run_epoch(loop, loader)
    assert seen == [1, 2, 3]
    assert all(r["device_util_pct"] == 42.0 and r["device_mem_used_bytes"] == 7 for r in records)


def test_without_device_fields_the_record_fields_are_null() -> None:
    loop, loader, records = make_loop()
    run_epoch(loop, loader)
    assert {(r["device_util_pct"], r["device_mem_used_bytes"]) for r in records} == {(None, None)}


def recorder(emit: Callable[..., None]) -> StepRecorder:
    precision = PrecisionPolicy(MixedPrecisionConfig(dtype="fp32"), CPU)
    return StepRecorder(
        scheduler=None,
        precision=precision,
        errors=ErrorHandler(),
        device=device_of(CPU),
        emit=emit,
    )


def outcome(step: int, losses: Iterator[float]) -> StepOutcome:
    micro = [torch.tensor(next(losses)), torch.tensor(next(losses))]
    readback = Readback(micro, [3, 1], None, torch.tensor(0.5), False, None, 0.1)
    return StepOutcome(readback, 0, step, 4, 0.01, 0.0)


def test_settle_reads_the_deferred_step_once() -> None:
    records: list[dict[str, Any]] = []
    rec = recorder(lambda event, **f: records.append({"event": event, **f}))
    assert rec.settle() is NOTHING_PENDING
    rec.defer(outcome(1, iter([1.0, 5.0])))
    scalars = rec.settle()
    assert scalars is not NOTHING_PENDING
    assert (scalars.loss, scalars.grad_norm, scalars.skipped) == (2.0, 0.5, False)  # (3+5)/4
    assert rec.settle() is NOTHING_PENDING
    assert [(r["event"], r["step"]) for r in records] == [("train_step", 1)]
    assert (rec.stats.steps, rec.stats.samples, rec.stats.loss_sum) == (1, 4, 8.0)


class EveryThird:
    """A step hook due after every third global step."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def next_due(self, step: int) -> int | None:
        return next_multiple(step, 3)

    def __call__(self, step: int) -> None:
        self.seen.append(step)


def test_a_step_hook_is_called_only_after_the_steps_it_names_across_epochs() -> None:
    hook = EveryThird()
    loop, loader, _ = make_loop(batches=5, step_hooks=[hook])
    run_epoch(loop, loader)
    loop.run_epoch(loader, 1, threading.Event())
    assert hook.seen == [3, 6, 9]  # global steps 1-10 over two epochs of 5


def test_the_schedule_runs_hooks_due_on_one_step_in_order_and_keeps_the_earliest() -> None:
    calls: list[str] = []
    third = EveryThird()
    schedule = StepSchedule([third, lambda step: calls.append(f"every {step}")])
    assert schedule.start(0) == 1
    assert schedule.reached(1) == 2 and calls == ["every 1"]
    schedule.reached(2)
    assert schedule.reached(3) == 4 and third.seen == [3]
    assert next_multiple(7, None, 5, 4) == 8 and next_multiple(7, None) is None


def test_one_batch_a_step_trains_the_weights_the_micro_batch_path_trains() -> None:
    torch.manual_seed(0)
    plain, loader, plain_records = make_loop(batches=4)
    torch.manual_seed(0)
    windowed, _, window_records = make_loop(batches=4)
    assert not plain.optimizer_step.windowed  # one batch, one backward: inline
    assert make_loop(accumulation_steps=2)[0].optimizer_step.windowed
    windowed.optimizer_step.windowed = True  # the path accumulation and a split take
    run_epoch(plain, loader)
    run_epoch(windowed, loader)
    for a, b in zip(plain.model.parameters(), windowed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    fields = ("step", "loss", "grad_norm", "lr", "skipped", "samples")
    assert [[r[f] for f in fields] for r in plain_records] == [
        [r[f] for f in fields] for r in window_records
    ]


def core_calls(loop: StepLoop, batches: int) -> Counter[str]:
    """Python functions of ``core`` entered (``sys.setprofile``) over an epoch of ``batches``,
    counted by file."""
    root = str(Path(build_step.__code__.co_filename).parents[1])  # core/
    calls: Counter[str] = Counter()

    def count(frame: FrameType, event: str, _: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            calls[frame.f_code.co_filename[len(root) + 1 :]] += 1

    data = make_classification(8 * batches).tensors
    loader = [(x, y) for x, y in zip(data[0].split(8), data[1].split(8), strict=True)]
    sys.setprofile(count)
    try:
        loop.run_epoch(loader, 0, threading.Event())
    finally:
        sys.setprofile(None)
    return calls


def test_a_plain_step_enters_at_most_16_functions_in_8_files_of_core() -> None:
    """The step's Python cost, counted rather than timed: the loop's bookkeeping, the batch
    check, the step, the lagged read and its record (an epoch's fixed cost taken out); and
    how far a reader follows it: the files whose calls grow with the steps."""
    loop, _, _ = make_loop()
    core_calls(loop, 2)  # the optimizer's state and the autocast context are created once
    short, long = core_calls(loop, 2), core_calls(loop, 10)
    per_step = (long.total() - short.total()) / 8
    assert per_step <= 16
    per_step_files = sorted(name for name in long if long[name] > short[name])
    assert len(per_step_files) <= 8, per_step_files
