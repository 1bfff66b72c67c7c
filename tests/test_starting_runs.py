"""Creating and starting runs does no heavy work on the event loop's thread.

A service creates runs on its event loop's thread (a request handler calls the factory or
the constructor) and awaits ``train()`` there. Three runs of the email-sequence example are
created and started at once (thread mode from the factory and from the constructor, process
mode from the factory), while a profile function (``sys.setprofile``, which sees only the
thread that sets it) records what runs on the loop's thread, from the first creation until
every run's first ``train_step`` record has arrived. None of the guarded functions below may
appear there: the work they stand for belongs in the worker thread that starts the run. The
assertion is about where work runs, never how long it takes (``python -m
benchmarks.service_start`` measures the heartbeat beside ten such starts).

The errors of that work still come, with the same text, from where the run starts.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import core.checks
import core.telemetry.init_hash
import core.trainer.assembly.build
import core.trainer.assembly.model_setup
import core.trainer.process.shared
from core import (
    Callback,
    ConfigError,
    OptimizedTrainingOptimizer,
    RunConfig,
    TrainingConfig,
    create_optimized_training_optimizer,
)
from core.callbacks import Record, RunInfo
from core.telemetry.config import LoggingConfig
from examples.email_sequence import EmailSequenceDataset, EmailSequenceModel
from tests.helpers import loaders, make_model

pytestmark = pytest.mark.anyio

GUARDED_PYTHON: dict[Any, str] = {
    core.telemetry.init_hash.weights_hash: "hashing the weights",
    core.trainer.assembly.build.build: "building the parts",
    core.trainer.assembly.model_setup.prepare_model: "placing the model",
    core.checks.check_writable_dir: "probing a directory with a file",
    core.trainer.process.shared.structure_of: "pickling what crosses",
    core.trainer.process.shared.pack: "copying what crosses",
    torch.save: "torch.save",
    tempfile.NamedTemporaryFile: "a temporary file",
    tempfile.mkstemp: "a temporary file",
    Path.mkdir: "a directory made",
    Path.write_text: "a file written",
    Path.write_bytes: "a file written",
}
"""Python functions that must not run on the event loop's thread while runs start."""
GUARDED_C: dict[Any, str] = {
    os.mkdir: "a directory made",
    os.open: "a file opened by descriptor (tempfile, the checkpoint store)",
    os.rename: "a file renamed",
    os.replace: "a file replaced",
    os.fsync: "a file synced",
    os.unlink: "a file removed",
    hashlib.sha256: "hashing",
    hashlib.new: "hashing",
    pickle.dumps: "pickling",
    pickle.dump: "pickling",
}
"""Builtins that must not run there (a pickler's ``dump`` method is guarded too)."""
_CODES = {function.__code__: what for function, what in GUARDED_PYTHON.items()}


class LoopThreadCalls:
    """Records the guarded calls made on the thread that enters it (``sys.setprofile``)."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __enter__(self) -> LoopThreadCalls:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in _CODES:
            self._note(frame.f_code.co_qualname, _CODES[frame.f_code], frame.f_back)
        elif event == "c_call":
            pickling = isinstance(getattr(arg, "__self__", None), pickle.Pickler)
            if pickling and getattr(arg, "__name__", "") == "dump":
                self._note("Pickler.dump", "pickling", frame)
            elif arg in GUARDED_C:
                self._note(arg.__name__, GUARDED_C[arg], frame)

    def _note(self, name: str, what: str, caller: FrameType | None) -> None:
        where = "?" if caller is None else f"{caller.f_code.co_filename}:{caller.f_lineno}"
        self.seen.setdefault(f"{name} ({what})", where)


class FirstStep(Callback):
    def __init__(self) -> None:
        self.seen = anyio.Event()

    async def on_train_step(self, run: RunInfo, record: Record) -> None:
        self.seen.set()


def _config(log_dir: Path, name: str, isolation: str) -> TrainingConfig:
    return TrainingConfig(
        run=RunConfig(
            experiment_name=name, max_epochs=1, log_dir=log_dir, isolation=isolation, seed=0
        ),
        logging=LoggingConfig(progress=False, reports=False),
    )


async def test_creating_and_starting_runs_leaves_the_heavy_work_off_the_loop_thread(
    log_dir: Path,
) -> None:
    data = EmailSequenceDataset(96, seed=0)
    models = [
        EmailSequenceModel(
            vocab_size=data.vocab_size, max_emails=data.max_emails, subject_len=data.subject_len
        )
        for _ in range(3)
    ]
    batches = [DataLoader(data, batch_size=32) for _ in range(3)]  # built beforehand
    clocks = [FirstStep() for _ in range(3)]
    creators: list[Callable[[], OptimizedTrainingOptimizer]] = [
        lambda: create_optimized_training_optimizer(
            model=models[0],
            train_loader=batches[0],
            config=_config(log_dir, "factory", "thread"),
            callbacks=[clocks[0]],
        ),
        lambda: OptimizedTrainingOptimizer(
            _config(log_dir, "constructor", "thread"),
            model=models[1],
            train_loader=batches[1],
            callbacks=[clocks[1]],
        ),
        lambda: create_optimized_training_optimizer(
            model=models[2],
            train_loader=batches[2],
            config=_config(log_dir, "process", "process"),
            callbacks=[clocks[2]],
        ),
    ]
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(120), LoopThreadCalls() as calls:
            runs = [create() for create in creators]
            for run in runs:
                tg.start_soon(run.train)
            for clock in clocks:
                await clock.seen.wait()
    assert calls.seen == {}, calls.seen  # what ran there, and the line that called it
    assert [run.global_step for run in runs] == [3, 3, 3]  # and each trained to its end
    assert all(run.last_checkpoint is not None for run in runs)


async def test_what_the_start_checks_is_refused_at_the_start_with_the_same_error(
    tmp_path: Path,
) -> None:
    not_a_dir = tmp_path / "logs"
    not_a_dir.write_text("a file")
    model, (train, _) = make_model(), loaders()
    run = create_optimized_training_optimizer(  # inside a loop: nothing written yet
        model=model, train_loader=train, log_dir=not_a_dir, progress=False
    )
    with pytest.raises(ConfigError, match=r"log_dir=.* is invalid.*is a file, not a directory"):
        await run.train()
    local = create_optimized_training_optimizer(
        model=nn.Linear(8, 2),
        train_loader=train,
        loss_fn=lambda out, y: (out - y).sum(),
        log_dir=tmp_path / "ok",
        isolation="process",
        progress=False,
    )
    with pytest.raises(ConfigError, match=r"loss_fn=.*cannot cross.*does not pickle.*Fix: define"):
        await local.train()
    with pytest.raises(ConfigError, match=r"loss_fn=.*cannot cross"):
        await local.start()  # (async with) the same check, still refused
