"""Re-running an edited script trains; checkpoints named best always exist and load.

``resume="auto"`` continues only a compatible, unfinished lineage and otherwise starts a new
run with a ``fresh_start`` record; ``resume="strict"`` never starts over. The best
checkpoints (``save_best``, ``save_top_k``) are named before they are written, survive
resumes, re-runs and pruning, and early stopping watches the same ``monitor``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from core import (
    CheckpointConfig,
    CheckpointError,
    ConfigError,
    EarlyStoppingConfig,
    F1Score,
    Factory,
    IncompatibleCheckpointError,
    Metric,
    create_optimized_training_optimizer,
    load_model,
    load_weights,
)
from core.checkpointing.ranking import offer
from core.checkpointing.store import CheckpointStore
from core.console.banner import format_banner, format_retention
from tests.helpers import loaders, make_classification, make_model


def train(log_dir: Path, **kwargs: Any) -> Any:
    """A 3-epoch, 8-steps-per-epoch job of the quick start's shape; returns the run."""
    train_loader, val_loader = loaders(n=256, batch_size=32)
    kwargs.setdefault("model", make_model())
    kwargs.setdefault("train_loader", train_loader)
    kwargs.setdefault("val_loader", val_loader)
    run = create_optimized_training_optimizer(
        log_dir=log_dir,
        seed=0,
        max_epochs=kwargs.pop("max_epochs", 3),
        progress=False,
        **kwargs,
    )
    return Done(run, anyio.run(run.train))


class Done:
    """A trained run and its results (``done.results``); the run's views otherwise."""

    def __init__(self, run: Any, results: Any) -> None:
        self.run, self.results = run, results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run, name)


def records(run: Any, event: str) -> list[dict[str, Any]]:
    lines = (Path(run.run_dir) / "events.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def assert_loads(path: str | None) -> None:
    assert path is not None and Path(path).is_dir(), path
    load_weights(path, make_model())


def stored_best(checkpoint: Path) -> Any:
    state = CheckpointStore(checkpoint.parent, keep_last_n=1).load_state(checkpoint)
    return state["trainer"]["progress"]


# -- resume="auto" and resume="strict" --------------------------------------------------------
def test_a_rerun_of_a_finished_run_trains_again_and_says_why(log_dir: Path) -> None:
    first = train(log_dir, resume="auto")
    again = train(log_dir, resume="auto")
    assert again.run_dir != first.run_dir and again.results.global_step == 24
    (fresh,) = records(again, "fresh_start")
    assert fresh["reason"] == "finished" and fresh["path"] == first.last_checkpoint
    assert "completed max_epochs (3 of 3 epochs)" in fresh["detail"]
    assert not records(again, "resumed")


def test_a_rerun_after_an_edit_trains_and_names_the_differing_setting(log_dir: Path) -> None:
    train(log_dir, resume="auto", max_epochs=1)  # unfinished: max_epochs is 3 below
    edited = train(log_dir, resume="auto", learning_rate=3e-3)
    (fresh,) = records(edited, "fresh_start")
    assert fresh["reason"] == "incompatible"
    assert "learning_rate (checkpoint 0.001, now 0.003)" in fresh["detail"]
    assert edited.results.global_step == 24 and edited.results.epochs_completed == 3


def test_auto_continues_an_unfinished_compatible_lineage(log_dir: Path) -> None:
    first = train(log_dir, resume="auto", max_epochs=1)
    longer = train(log_dir, resume="auto", max_epochs=3)
    (resumed,) = records(longer, "resumed")
    assert resumed["path"] == first.last_checkpoint and resumed["step"] == 8
    assert not records(longer, "fresh_start") and longer.results.global_step == 24


def test_strict_continues_a_finished_run_and_refuses_an_edited_one(log_dir: Path) -> None:
    first = train(log_dir)
    strict = train(log_dir, resume="strict")
    assert records(strict, "resumed")[0]["path"] == first.last_checkpoint
    assert strict.results.global_step == 24 and not records(strict, "train_step")
    with pytest.raises(IncompatibleCheckpointError, match=r"learning_rate \(checkpoint 0.001"):
        train(log_dir, resume="strict", learning_rate=3e-3)


# -- the batches after a resume ------------------------------------------------------------
def shuffled(where: str) -> DataLoader[Any]:
    """A loader shuffled by a generator of its own (a program's, made anew by each start),
    given to the DataLoader or to its sampler."""
    data, generator = make_classification(256), torch.Generator().manual_seed(5)
    if where == "loader":
        return DataLoader(data, batch_size=32, shuffle=True, generator=generator)
    return DataLoader(data, batch_size=32, sampler=RandomSampler(data, generator=generator))


class StopsAt(torch.nn.Module):
    """The quick start's model, asking its run to stop after its ``call``-th training forward."""

    def __init__(self, call: int) -> None:
        super().__init__()
        self.net, self.call, self.calls = make_model(), call, 0
        self.run: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        if self.calls == self.call and self.training:
            self.run.request_stop("a test")  # honoured at the end of this step
        out: torch.Tensor = self.net(x)
        return out


@pytest.mark.parametrize("where", ["loader", "sampler"])
def test_a_loader_s_own_generator_resumes_onto_the_batches_of_an_uninterrupted_run(
    log_dir: Path, where: str
) -> None:
    reference = train(log_dir / "ref", model=StopsAt(0), train_loader=shuffled(where))
    model = StopsAt(13)  # epoch 1, its 5th batch
    stopped = create_optimized_training_optimizer(
        model=model,
        train_loader=shuffled(where),
        val_loader=loaders()[1],
        log_dir=log_dir,
        seed=0,
        max_epochs=3,
        progress=False,
    )  # as train() builds it
    model.run = stopped
    assert anyio.run(stopped.train).global_step == 13
    resumed = train(log_dir, model=StopsAt(0), train_loader=shuffled(where), resume="auto")
    assert resumed.results.global_step == 24
    for ours, theirs in zip(resumed.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    (record,) = records(resumed, "resumed")
    assert (record["step"], record["data_order"], record["data_order_detail"]) == (
        13,
        "restored",
        None,
    )


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Batches of a dataset that sets its own order."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from make_classification(96)


def test_a_resume_says_when_it_cannot_restore_the_order_of_the_batches(log_dir: Path) -> None:
    stream = DataLoader(Stream(), batch_size=32)
    train(log_dir, train_loader=stream, max_epochs=1)
    resumed = train(log_dir, train_loader=stream, max_epochs=2, resume="auto")
    (record,) = records(resumed, "resumed")
    assert record["data_order"] == "not_restored"
    detail = record["data_order_detail"]
    assert "dataset is an IterableDataset (Stream), which sets its own order" in detail


# -- best checkpoints you can trust -------------------------------------------------------
def test_best_checkpoint_exists_and_loads_after_a_rerun_with_pruning(log_dir: Path) -> None:
    """The issue's reproduction: save_best, keep_last_n=1, resume="auto", run twice."""
    for _ in range(2):
        run = train(log_dir, save_best=True, keep_last_n=1, resume="auto")
        assert_loads(run.results.best_checkpoint)
        for info in run.checkpoints:  # what each checkpoint stores names one that exists
            progress = stored_best(info.path)
            assert progress["best_checkpoint"] is not None
            assert_loads(progress["best_checkpoint"])


def test_a_checkpoint_that_becomes_the_best_holds_itself_as_the_best(log_dir: Path) -> None:
    """A step checkpoint at the epoch's last step predates that epoch's validation: the
    new best and the epoch's end write it again, in place."""
    run = train(log_dir, save_best=True, checkpoint_every_n_steps=8, keep_last_n=1)
    best = Path(run.results.best_checkpoint)
    assert stored_best(best)["best_checkpoint"] == str(best)
    newest = run.checkpoints.latest
    assert newest is not None and newest.epoch == 3  # the epoch's end is in it
    state = CheckpointStore(newest.path.parent, keep_last_n=1).load_state(newest.path)
    assert state["trainer"]["epoch"] == 3
    assert not list(newest.path.parent.glob(".*staging*"))  # the replaced one is gone


def test_a_resume_whose_best_was_deleted_forgets_it_and_says_so(log_dir: Path) -> None:
    # The training loss falls: watched with mode="max", the first epoch stays the best.
    job = {"save_best": True, "keep_last_n": 3, "monitor": "train_loss", "mode": "max"}
    first = train(log_dir, max_epochs=2, **job)
    best = Path(first.results.best_checkpoint)
    assert best != Path(first.last_checkpoint)
    shutil.rmtree(best)  # a user tidying up by hand
    resumed = train(log_dir, resume="auto", max_epochs=3, **job)
    (missing,) = [r for r in records(resumed, "error") if r["kind"] == "best_checkpoint_missing"]
    assert missing["path"] == str(best) and missing["level"] == "warning"
    assert_loads(resumed.results.best_checkpoint)
    assert resumed.results.best_checkpoint != str(best)


def test_save_top_k_keeps_the_k_best_by_monitor_and_prunes_the_rest(log_dir: Path) -> None:
    run = train(
        log_dir, save_top_k=2, keep_last_n=1, monitor="val_accuracy", mode="max", max_epochs=5
    )
    values = [(r["val_accuracy"], r["step"]) for r in records(run, "validation")]
    ranked: list[list[float | str]] = []
    for value, step in values:
        ranked = offer(ranked, value, f"step-{step:09d}", k=2, mode="max") or ranked
    kept_steps = sorted(int(str(name)[5:]) for _, name in ranked)
    on_disk = {info.step for info in run.checkpoints}
    assert set(kept_steps) <= on_disk <= {*kept_steps, run.results.global_step}
    progress = run.results
    assert progress.best_value == max(v for v, _ in values)
    assert_loads(progress.best_checkpoint)


class Scripted(Metric):
    """A validation metric that takes the given values, one per validation."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(size=1)
        self.values = list(values)

    def update(self, outputs: Any, targets: Any) -> None:
        self.add(torch.ones(1))

    def compute(self, state: torch.Tensor) -> float | None:
        return self.values.pop(0)


# Epoch by epoch (8 steps each): better, better, worse, the best, the worst.
SCORES = [0.5, 0.3, 0.4, 0.2, 0.6]


def scored(log_dir: Path, **kwargs: Any) -> Any:
    """A run whose monitored value takes the ``SCORES``, one per epoch."""
    scripted = {"scripted": Scripted(SCORES)}  # one value per validation: no sanity check
    return train(
        log_dir, monitor="val_scripted", metrics=scripted, num_sanity_val_steps=0, **kwargs
    )


def kept_steps(run: Any) -> set[int]:
    return {info.step for info in run.checkpoints}


def test_save_top_k_with_save_last_keeps_the_k_best_and_the_newest(log_dir: Path) -> None:
    run = scored(log_dir, save_top_k=2, save_last=True, max_epochs=5)
    assert [r["metrics"]["scripted"] for r in records(run, "validation")] == SCORES
    assert kept_steps(run) == {32, 16, 40}  # 0.2 and 0.3, and the newest (Lightning's last)
    last = Path(run.checkpoints.directory) / "last"
    assert last.resolve() == Path(run.last_checkpoint).resolve() and "000040" in last.resolve().name
    assert run.results.best_value == 0.2 and "000032" in run.results.best_checkpoint


def test_the_newest_is_not_counted_twice_when_it_is_one_of_the_best(log_dir: Path) -> None:
    run = scored(log_dir, save_top_k=2, max_epochs=4)
    assert kept_steps(run) == {32, 16}


def test_save_top_k_0_keeps_only_the_newest_checkpoint(log_dir: Path) -> None:
    run = train(log_dir, save_top_k=0, checkpoint_every_n_steps=4)
    assert kept_steps(run) == {24} and run.results.best_checkpoint is None


def test_an_explicit_keep_last_n_is_honoured_besides_the_best(log_dir: Path) -> None:
    run = scored(log_dir, save_top_k=2, keep_last_n=3, max_epochs=5)
    assert kept_steps(run) == {16, 24, 32, 40}  # the 3 newest and, apart, step 16 (0.3)
    assert kept_steps(train(log_dir, keep_last_n=3, experiment_name="plain")) == {8, 16, 24}
    assert kept_steps(train(log_dir, experiment_name="default")) == {16, 24}  # the 2 newest


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            {"save_top_k": 2, "save_last": True},
            "keeps the 2 best by val_loss (min) + the newest; last -> newest",
        ),
        (
            {"save_best": True, "monitor": "val_accuracy", "mode": "max"},
            "keeps the best by val_accuracy (max) + the newest",
        ),
        ({"save_top_k": -1}, "keeps every checkpoint scored by val_loss + the newest"),
        ({"save_top_k": 2, "keep_last_n": 3}, "keeps the 2 best by val_loss (min) + the 3 newest"),
        ({}, "keeps the 2 newest"),
        ({"save_top_k": 0}, "keeps the newest"),
        ({"keep_last_n": 3, "save_last": True}, "keeps the 3 newest; last -> newest"),
    ],
)
def test_the_banner_says_which_checkpoints_are_kept(settings: dict[str, Any], line: str) -> None:
    described = {"resolved": {"checkpoints": CheckpointConfig(**settings).describe()}}
    assert format_retention(described) == line
    assert f"checkpoints  {line}" in format_banner(described)
    smoke = {"resolved": {"checkpoints": {**described["resolved"]["checkpoints"], "saves": False}}}
    assert format_retention(smoke) == "nothing saved"
    assert format_retention({"resolved": {}}) is None  # an older run's record: no line


def test_keep_last_n_is_none_or_a_positive_integer() -> None:
    assert CheckpointConfig(keep_last_n=None).keep_newest == 2
    allowed = r"allowed: None \(the default rule\) or an integer >= 1\. Fix: e\.g\. keep_last_n=3"
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError, match=rf"^keep_last_n={bad!r} is invalid; {allowed}"):
            CheckpointConfig(keep_last_n=bad)


def test_save_last_links_the_newest_checkpoint(log_dir: Path) -> None:
    run = train(log_dir, save_last=True, checkpoint_every_n_steps=5)
    link = Path(run.checkpoints.directory) / "last"
    assert link.is_symlink() and link.resolve() == Path(run.last_checkpoint).resolve()
    assert load_weights(link, make_model()).step == 24
    again = train(log_dir, resume=str(link), max_epochs=4)
    assert records(again, "resumed")[0]["step"] == 24 and again.results.global_step == 32


# -- early stopping on monitor ---------------------------------------------------------------
def test_early_stopping_follows_the_checkpoint_monitor_and_mode(log_dir: Path) -> None:
    # The training loss falls every epoch: watched with mode="max" it never improves.
    run = train(
        log_dir,
        max_epochs=10,
        early_stopping_patience=2,
        monitor="train_loss",
        mode="max",
        val_loader=None,
    )
    assert run.results.stopped_early and run.results.epochs_completed == 3


def test_early_stopping_on_a_metric_of_its_own(log_dir: Path) -> None:
    # No F1 improves by more than 1.0: the second epoch is the first bad one.
    run = train(
        log_dir,
        max_epochs=10,
        metrics={"f1": F1Score(num_classes=2)},
        early_stopping_patience=1,
        early_stopping_monitor="val_f1",
        early_stopping_mode="max",
        early_stopping_min_delta=1.0,
    )
    assert run.results.stopped_early and run.results.epochs_completed == 2


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"save_top_k": -2}, r"save_top_k=-2 is invalid; allowed: None, -1 \(all\) or an"),
        ({"save_top_k": 0, "save_best": True}, r"save_top_k=0 is invalid"),
        ({"resume": "Strict"}, r"write resume='strict' in lower case"),
    ],
)
def test_checkpoint_settings_are_checked_at_creation(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        CheckpointConfig(**kwargs)


def test_an_early_stopping_monitor_the_run_never_produces_is_refused(log_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"early_stopping.monitor='val_f1' is invalid"):
        train(log_dir, early_stopping_patience=2, early_stopping_monitor="val_f1")
    with pytest.raises(ConfigError, match=r"early_stopping.mode='up' is invalid"):
        EarlyStoppingConfig(mode="up")  # type: ignore[arg-type]


# -- core.load_model --------------------------------------------------------------------------
def test_load_model_rebuilds_a_factory_model_from_its_checkpoint(log_dir: Path) -> None:
    run = train(log_dir, model=Factory("tests.helpers:make_model", hidden=12), save_best=True)
    model = load_model(run.results.best_checkpoint)
    assert model[0].out_features == 12 and not model.training
    reference = make_model(hidden=12)
    load_weights(run.results.best_checkpoint, reference)
    for mine, theirs in zip(
        model.state_dict().values(), reference.state_dict().values(), strict=True
    ):
        assert torch.equal(mine, theirs)
    by_name = train(log_dir, model="tests.helpers:make_model", experiment_name="named")
    assert load_model(by_name.last_checkpoint)[0].out_features == 16


def test_load_model_without_a_recorded_factory_says_to_use_load_weights(log_dir: Path) -> None:
    run = train(log_dir, max_epochs=1)
    with pytest.raises(CheckpointError, match=r"load_weights\(path, model\)"):
        load_model(run.last_checkpoint)


def test_a_factory_takes_only_json_arguments_and_a_valid_name() -> None:
    with pytest.raises(ConfigError, match=r"allowed: JSON values"):
        Factory("tests.helpers:make_model", hidden=object())
    with pytest.raises(ConfigError, match=r"Factory.target='make_model' is invalid"):
        Factory("make_model")
    assert Factory("tests.helpers:make_model", hidden=3) == Factory(
        "tests.helpers:make_model", hidden=3
    )
    assert isinstance(DataLoader, type)
