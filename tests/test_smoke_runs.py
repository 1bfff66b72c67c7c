"""Smoke runs as Lightning has them: ``fast_dev_run`` pushes one (or n) train and val
batch through every part and hook and leaves nothing behind (no checkpoint, no run
directory, unless ``keep_fast_dev_run_files``); ``limit_train_batches`` /
``limit_val_batches`` cap an epoch, and the plan, the accumulation windows and the
scheduler agree with the cap."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR, OneCycleLR
from torch.utils.data import DataLoader, Dataset, IterableDataset

from core import (
    Callback,
    ConfigError,
    DataConfig,
    OptimizedTrainingOptimizer,
    RunConfig,
    TrainingConfig,
    TrainingStepError,
    create_optimized_training_optimizer,
)
from core.callbacks import Record, RunInfo
from core.checkpointing.config import CheckpointConfig
from core.checkpointing.weights import load_weights
from core.cli import run_fit
from core.cli.fit import fit_parser, resolve_config
from core.cli.recipes import scheduler_factory, steps_per_epoch
from core.console import format_banner
from core.loop.accumulation import GradientAccumulationConfig
from core.loop.limit import limit_batches
from core.telemetry.config import LoggingConfig
from core.trainer.process import child
from tests import isolation_parts
from tests.helpers import make_classification, make_model

pytestmark = pytest.mark.anyio
BATCH = 8


@pytest.fixture
def anyio_backend() -> str:
    """asyncio here: the features are the loop's and the tree's (the first test runs on both)."""
    return "asyncio"


class Counted(Dataset[Any]):
    """A dataset that counts the samples drawn from it (``drawn // BATCH``: batches)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.data = make_classification(n, seed=seed)
        self.drawn = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        self.drawn += 1
        return self.data[index]

    @property
    def batches(self) -> int:
        return math.ceil(self.drawn / BATCH)


class Stream(IterableDataset[Any]):
    """A stream of ``n`` samples (no ``len()``), counting those drawn."""

    def __init__(self, n: int) -> None:
        self.data, self.drawn = make_classification(n), 0

    def __iter__(self) -> Any:
        for i in range(len(self.data)):
            self.drawn += 1
            yield self.data[i]


class Hooks(Callback):
    def __init__(self) -> None:
        self.hooks: list[str] = []
        self.records: list[Record] = []
        self.run_dir: Path | None = None  # run.run_dir while the run lasts

    async def on_run_start(self, run: RunInfo, record: Record) -> None:
        self.hooks.append("run_start")
        self.run_dir = run.run_dir

    async def on_record(self, run: RunInfo, record: Record) -> None:
        self.records.append(record)
        if "record" not in self.hooks:
            self.hooks.append("record")

    def named(self, name: str) -> list[Record]:
        return [r for r in self.records if r["event"] == name]

    async def on_epoch_end(self, run: RunInfo, record: Record) -> None:
        self.hooks.append("epoch_end")

    async def on_checkpoint(self, run: RunInfo, record: Record) -> None:
        self.hooks.append("checkpoint")

    async def on_run_end(self, run: RunInfo, record: Record) -> None:
        self.hooks.append(f"run_end:{record['status']}")

    async def on_run_closed(self, run: RunInfo) -> None:
        self.hooks.append("run_closed")


def job(
    log_dir: Path,
    train: Counted,
    val: Counted | None,
    callbacks: Sequence[Callback] = (),
    accumulation_steps: int = 1,
    scheduler: Any = None,
    progress: bool = False,
    reports: bool = False,
    **run: Any,
) -> OptimizedTrainingOptimizer:
    config = TrainingConfig(
        run=RunConfig(log_dir=log_dir, experiment_name="smoke", **({"max_epochs": 2} | run)),
        accumulation=GradientAccumulationConfig(accumulation_steps=accumulation_steps),
        checkpoint=CheckpointConfig(checkpoint_every_n_steps=1, save_best=True, resume="auto"),
        logging=LoggingConfig(progress=progress, reports=reports),
        data=DataConfig(rebuild_loaders=False),  # Counted counts what this process loads
    )
    return OptimizedTrainingOptimizer(
        config,
        model=make_model(),
        train_loader=DataLoader(train, batch_size=BATCH),
        val_loader=None if val is None else DataLoader(val, batch_size=BATCH),
        callbacks=callbacks,
        scheduler=scheduler,
    )


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def events(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [r for r in records(run_dir) if r["event"] == name]


def checkpoint_files(log_dir: Path) -> list[Path]:
    return sorted((log_dir / "smoke" / "checkpoints").rglob("*"))


def everything_in(log_dir: Path) -> list[Path]:
    return sorted(log_dir.rglob("*")) if log_dir.exists() else []


# -- fast_dev_run -------------------------------------------------------------------------
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_fast_dev_run_takes_one_batch_of_each_through_every_hook_and_saves_nothing(
    log_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, val, seen = Counted(80), Counted(32, seed=1), Hooks()
    async with job(
        log_dir,
        train,
        val,
        [seen],
        fast_dev_run=True,
        max_epochs=5,
        max_steps=9,
        val_every_n_steps=1,
        progress=True,
    ) as run:
        results = await run.train()
    assert (train.batches, val.batches) == (1, 1)
    assert (results.global_step, results.epochs_completed) == (1, 1)
    assert seen.hooks == ["record", "run_start", "epoch_end", "run_end:completed", "run_closed"]
    assert not log_dir.exists()  # no checkpoint (step, epoch or best), no run directory
    assert results.last_checkpoint is None and run.config.run.max_epochs == 1
    start = seen.named("run_start")[0]
    assert start["config"]["run"]["fast_dev_run"] is True
    assert start["plan"]["batches_per_epoch"] == start["plan"]["steps_per_epoch"] == 1
    assert [r["samples"] for r in seen.named("validation")] == [BATCH]
    assert not seen.named("checkpoint")
    console = capsys.readouterr()
    assert "fast_dev_run  1 train and 1 val batch, nothing saved" in console.out + console.err
    assert "checkpoints   nothing saved" in console.out + console.err

    again = Counted(80)  # a later resume="auto" run finds nothing to resume
    results = await job(log_dir, again, Counted(8), max_epochs=1).train()
    assert not events(results.run_dir, "resumed") and not events(results.run_dir, "fresh_start")
    assert events(results.run_dir, "train_step")[0]["step"] == 1
    assert again.batches == 10 and results.global_step == 10 and checkpoint_files(log_dir)


async def test_fast_dev_run_n_takes_n_batches_and_a_short_last_window_steps(log_dir: Path) -> None:
    train, val, seen = Counted(80), Counted(64, seed=1), Hooks()
    results = await job(log_dir, train, val, [seen], fast_dev_run=3, accumulation_steps=2).train()
    assert (train.batches, val.batches, results.global_step) == (3, 3, 2)
    assert [r["samples"] for r in seen.named("train_step")] == [2 * BATCH, BATCH]
    assert seen.named("validation")[0]["samples"] == 3 * BATCH


async def test_a_fast_dev_run_leaves_the_log_dir_as_it_was_and_still_reports_its_records(
    log_dir: Path,
) -> None:
    (log_dir / "other").mkdir(parents=True)
    (log_dir / "other" / "notes.txt").write_text("a user's file")
    before = everything_in(log_dir)
    seen, streamed = Hooks(), list[Record]()
    run = job(log_dir, Counted(80), Counted(32, seed=1), [seen], fast_dev_run=True, reports=True)
    stream = run.events()  # subscribed before train() starts: every record

    async def consume() -> None:
        async with stream:
            streamed.extend([record async for record in stream])

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        results = await run.train()
    assert everything_in(log_dir) == before  # no file, no folder (not even logs/smoke)
    for received in (streamed, seen.records):
        assert received[0]["event"] == "run_start" and received[-1]["event"] == "run_end"
        assert received[-1]["run_dir"] is None and received[-1]["status"] == "completed"
    assert results.run_dir is None and results.to_dict()["run_dir"] is None
    assert seen.run_dir is not None and not seen.run_dir.exists()  # temporary, now removed
    assert log_dir not in seen.run_dir.parents


async def test_keep_fast_dev_run_files_keeps_the_run_directory(log_dir: Path) -> None:
    seen, kept = Hooks(), {"fast_dev_run": True, "keep_fast_dev_run_files": True}
    results = await job(log_dir, Counted(80), Counted(32, seed=1), [seen], **kept).train()
    assert results.run_dir is not None and results.run_dir.parent == log_dir / "smoke"
    assert [r["event"] for r in records(results.run_dir)] == [r["event"] for r in seen.records]
    assert (results.run_dir / "config.json").is_file() and events(results.run_dir, "run_end")
    assert events(results.run_dir, "run_end")[0]["run_dir"] == str(results.run_dir)
    assert not (log_dir / "smoke" / "checkpoints").exists()  # still no checkpoint


def failing_on_second_call() -> Any:
    calls = {"n": 0}

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("a bug in the loss")
        return torch.nn.functional.cross_entropy(outputs, targets)

    return loss


async def test_a_fast_dev_run_that_fails_after_a_step_writes_no_error_checkpoint(
    log_dir: Path,
) -> None:
    config = TrainingConfig(
        run=RunConfig(log_dir=log_dir, experiment_name="smoke", fast_dev_run=2),
        logging=LoggingConfig(progress=False, reports=False),
    )
    run = OptimizedTrainingOptimizer(
        config,
        model=make_model(),
        train_loader=DataLoader(Counted(80), batch_size=BATCH),
        loss_fn=failing_on_second_call(),
    )
    with pytest.raises(TrainingStepError, match="a bug in the loss"):
        await run.train()
    assert not (log_dir / "smoke" / "checkpoints").exists()


def test_the_banner_says_how_many_batches_a_smoke_run_takes() -> None:
    def start(smoke: object, val: bool) -> Record:
        return {
            "event": "run_start",
            "config": {"run": {"fast_dev_run": smoke}},
            "plan": {"has_validation": val},
        }

    assert format_banner(start(3, True)).startswith(
        "fast_dev_run  3 train and 3 val batches, nothing saved"
    )
    assert "1 train batch, nothing saved" in format_banner(start(True, False))
    assert "fast_dev_run" not in format_banner(start(False, True))


# -- limits -------------------------------------------------------------------------------
async def test_limit_train_batches_with_accumulation_steps_every_window_and_the_scheduler(
    log_dir: Path,
) -> None:
    train, val = Counted(80), Counted(64, seed=1)
    calls: list[int] = []

    def schedule(optimizer: torch.optim.Optimizer) -> LambdaLR:
        return LambdaLR(optimizer, lambda step: calls.append(step) or 1.0)  # type: ignore[func-returns-value]

    async with job(
        log_dir,
        train,
        val,
        limit_train_batches=3,
        limit_val_batches=2,
        accumulation_steps=2,
        scheduler=schedule,
    ) as run:
        results = await run.train()
        plan = run.describe()["plan"]
    assert (plan["batches_per_epoch"], plan["steps_per_epoch"]) == (3, 2)
    assert (train.batches, val.batches) == (2 * 3, 2 + 2 * 2)  # the sanity check's 2 first
    assert results.global_step == 4 and calls == [0, 1, 2, 3, 4]  # built, then 4 steps
    steps = events(results.run_dir, "train_step")
    assert [r["samples"] for r in steps] == [2 * BATCH, BATCH] * 2
    assert [r["samples"] for r in events(results.run_dir, "validation")] == [2 * BATCH] * 2

    config = run.config.replace({"run.max_epochs": 3})  # core-train's schedules agree
    factory = scheduler_factory("onecycle", config, DataLoader(range(80), batch_size=BATCH), 1)
    assert factory is not None
    scheduler = factory(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    assert isinstance(scheduler, OneCycleLR) and scheduler.total_steps == 3 * 2


async def test_float_limits_take_that_fraction_of_each_loader(log_dir: Path) -> None:
    train, val = Counted(80), Counted(64, seed=1)  # 10 and 8 batches
    results = await job(
        log_dir, train, val, max_epochs=1, limit_train_batches=0.55, limit_val_batches=0.25
    ).train()
    assert (train.batches, val.batches, results.global_step) == (5, 2 + 2, 5)  # sanity: 2
    loader = DataLoader(range(80), batch_size=BATCH)
    assert steps_per_epoch(loader, 2, 1, limit=0.55) == 3
    assert steps_per_epoch(loader, 1, 1, limit=1.0) == 10


async def test_a_fraction_too_small_for_the_loader_fails_at_build_naming_the_fix(
    log_dir: Path,
) -> None:
    with pytest.raises(
        ConfigError,
        match=(
            r"^limit_train_batches=0\.05 is invalid; allowed: a fraction of at least 0\.1 \(1 of "
            r"this loader's 10 batches\), or an integer\. Fix: pass limit_train_batches=1"
        ),
    ):
        async with job(log_dir, Counted(80), Counted(8), limit_train_batches=0.05):
            pass


def test_a_stream_takes_an_integer_limit_and_refuses_a_fraction() -> None:
    stream = Stream(80)
    limited = limit_batches(DataLoader(stream, batch_size=BATCH), 2, "limit_train_batches")
    assert len(list(limited)) == 2 and stream.drawn == 2 * BATCH  # the third is never drawn
    assert not hasattr(limited, "__len__")  # still a stream to the ranks' lockstep
    with pytest.raises(
        ConfigError,
        match=r"^limit_val_batches=0\.5 is invalid; allowed: None or"
        r" an integer number of batches for a loader without len\(\)",
    ):
        limit_batches(DataLoader(stream, batch_size=BATCH), 0.5, "limit_val_batches")


# -- bad values, flat keywords, the command line, process isolation ------------------------
LIMIT_ALLOWED = (
    r"allowed: None \(all batches\), an integer >= 1 \(that many batches\) or a float in "
    r"\(0, 1\] \(that fraction of the loader\)\. Fix: "
)


@pytest.mark.parametrize(
    ("settings", "pattern"),
    [
        ({"limit_train_batches": 0}, r"^limit_train_batches=0 is invalid; " + LIMIT_ALLOWED),
        ({"limit_train_batches": -2}, r"^limit_train_batches=-2 is invalid; " + LIMIT_ALLOWED),
        ({"limit_train_batches": True}, r"^limit_train_batches=True is invalid; " + LIMIT_ALLOWED),
        ({"limit_val_batches": 1.5}, r"^limit_val_batches=1\.5 is invalid; " + LIMIT_ALLOWED),
        ({"limit_val_batches": "3"}, r"^limit_val_batches='3' is invalid; "),
        ({"limit_val_batches": float("nan")}, r"^limit_val_batches=nan is invalid; "),
        ({"limit_train_batches": 4.0}, r"Fix: an int counts batches: limit_train_batches=4\.$"),
        ({"limit_val_batches": 0}, r"Fix: to skip validation, pass val_every_n_epochs=None"),
        (
            {"fast_dev_run": 0},
            r"^fast_dev_run=0 is invalid; allowed: False, True \(1 batch\) or an "
            r"integer >= 1 \(that many\)\. Fix: pass fast_dev_run=True",
        ),
        ({"fast_dev_run": -1}, r"^fast_dev_run=-1 is invalid; "),
        ({"fast_dev_run": 0.5}, r"^fast_dev_run=0\.5 is invalid; "),
        ({"fast_dev_run": "yes"}, r"^fast_dev_run='yes' is invalid; "),
    ],
)
def test_bad_values_raise_a_config_error_naming_field_value_allowed_and_fix(
    settings: dict[str, Any], pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern):
        RunConfig(**settings)
    path = next(iter(settings))
    with pytest.raises(ConfigError, match=rf"^run\.{path}="):
        TrainingConfig().replace({f"run.{path}": settings[path]})


def test_fast_dev_run_wins_over_max_epochs_max_steps_and_the_limits() -> None:
    run = RunConfig(
        fast_dev_run=4,
        max_epochs=7,
        max_steps=3,
        limit_train_batches=0.5,
        val_every_n_epochs=None,
        val_every_n_steps=5,
    ).for_run()
    assert (run.max_epochs, run.max_steps, run.limit_train_batches, run.limit_val_batches) == (
        1,
        None,
        4,
        4,
    )
    assert (run.val_every_n_epochs, run.val_every_n_steps) == (1, None)
    assert run.for_run() is run and RunConfig().for_run() == RunConfig()


async def test_flat_keywords_reach_the_run_section(log_dir: Path) -> None:
    train = Counted(80)
    run = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=DataLoader(train, batch_size=BATCH),
        log_dir=log_dir,
        fast_dev_run=2,
        limit_val_batches=0.5,
        limit_train_batches=3,
        progress=False,
        reports=False,
        rebuild_loaders=False,  # Counted counts what this process loads
    )
    assert run.config.run.fast_dev_run == 2 and run.config.run.limit_train_batches == 2
    results = await run.train()
    assert (train.batches, results.global_step) == (2, 2)
    with pytest.raises(ConfigError, match=r"^limit_val_batches=0 is invalid; allowed: None"):
        create_optimized_training_optimizer(
            model=make_model(), train_loader=DataLoader(train), limit_val_batches=0
        )


def test_the_command_line_flags_set_the_run_section(tmp_path: Path) -> None:
    parser = fit_parser()
    argv = ["--fast-dev-run", "--limit-train-batches", "0.5", "--limit-val-batches", "2"]
    run = resolve_config(parser.parse(argv), parser).run
    assert (run.fast_dev_run, run.limit_train_batches, run.limit_val_batches) == (True, 0.5, 2)
    assert resolve_config(parser.parse(["--fast-dev-run", "3"]), parser).run.fast_dev_run == 3
    kept = parser.parse(["--fast-dev-run", "--keep-fast-dev-run-files"])
    assert resolve_config(kept, parser).run.keep_fast_dev_run_files is True
    outcome = run_fit(
        [
            "--model",
            "tests.test_cli:tiny_model",
            "--data",
            "tests.test_cli:tiny_data",
            "--batch-size",
            "16",
            "--epochs",
            "4",
            "--scheduler",
            "onecycle",
            "--fast-dev-run",
            "--num-workers",
            "0",
            "--log-dir",
            str(tmp_path),
            "--no-progress",
            "--experiment",
            "cli",
        ]
    )
    assert outcome.exit_code == 0 and outcome.results is not None
    assert (outcome.results.global_step, outcome.results.epochs_completed) == (1, 1)
    assert outcome.results.run_dir is None and everything_in(tmp_path) == []  # no results.json


async def test_a_fast_dev_run_in_a_training_process_leaves_nothing(log_dir: Path) -> None:
    seen = Hooks()
    run = create_optimized_training_optimizer(
        model=isolation_parts.make_model(),
        train_loader=isolation_parts.make_loader(),
        val_loader=isolation_parts.make_val_loader(),
        log_dir=log_dir,
        experiment_name="smoke",
        isolation="process",
        fast_dev_run=True,
        max_epochs=3,
        checkpoint_every_n_steps=1,
        progress=False,
        reports=True,
        callbacks=[seen],
    )
    results = await run.train()
    assert (results.global_step, results.epochs_completed) == (1, 1)
    assert [r["samples"] for r in seen.named("validation")] == [BATCH]
    assert len(seen.named("train_step")) == 1
    assert seen.named("run_start")[0]["config"]["run"]["fast_dev_run"] is True
    assert seen.named("run_end")[0]["run_dir"] is None and results.run_dir is None
    assert everything_in(log_dir) == [] and len(run.checkpoints) == 0


def test_weights_handed_back_by_checkpoint_cross_a_temporary_folder_the_service_removes() -> None:
    """A smoke run in a training process has no run directory to hand its weights back
    through when they do not fit the given model: a temporary folder, removed once loaded."""
    trained = make_model(seed=3)
    strategy = SimpleNamespace(rank=0, model_state_dict=lambda model: model.state_dict())
    done = SimpleNamespace(model=trained, distribution=SimpleNamespace(strategy=strategy))
    packed = SimpleNamespace(block=None, model={})  # nothing fits: the checkpoint way
    results = SimpleNamespace(run_dir=None, global_step=1, epochs_completed=1)
    final = child.hand_back(packed, done, results)  # type: ignore[arg-type]
    assert final is not None and Path(final).is_dir()
    mine = make_model(seed=4)
    load_weights(final, mine)
    assert torch.equal(mine[0].weight, trained[0].weight)
    child.discard_handed_back(final)
    assert not Path(final).parent.parent.exists()
