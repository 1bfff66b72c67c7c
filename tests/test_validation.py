"""The validation schedule, max_steps, the best checkpoint, and what a run returns about them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch.utils.data import DataLoader

from core import (
    ConfigError,
    F1Score,
    OptimizedTrainingOptimizer,
    TrainingConfig,
    TrainingStepError,
    create_optimized_training_optimizer,
    load_weights,
)
from tests.helpers import loaders, make_classification, make_model


def run(tmp_path: Path, **settings: Any) -> tuple[Any, list[dict[str, Any]]]:
    train_loader, val_loader = loaders(n=256, batch_size=32)  # 8 steps per epoch
    settings.setdefault("val_loader", val_loader)
    optimizer = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=train_loader,
        log_dir=tmp_path,
        seed=0,
        progress=False,
        reports=False,
        **settings,
    )
    results = anyio.run(optimizer.train)
    optimizer.close()
    events = results.run_dir / "events.jsonl"
    return results, [json.loads(line) for line in events.read_text().splitlines()]


def of(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == event]


def test_validation_runs_every_n_steps_and_every_n_epochs_never_twice_at_a_step(
    tmp_path: Path,
) -> None:
    results, records = run(tmp_path, max_epochs=4, val_every_n_steps=3, val_every_n_epochs=2)
    steps = [r["step"] for r in of(records, "validation")]
    # Every 3 steps (3, 6, ..., 30), plus the ends of epochs 2 and 4 (steps 16 and 32).
    assert steps == [3, 6, 9, 12, 15, 16, 18, 21, 24, 27, 30, 32]
    assert [r["step"] for r in of(records, "validation_start")] == steps
    assert of(records, "validation_start")[0]["batches"] == 2
    # A mid-epoch validation comes after the records of the steps before it.
    order = [(r["event"], r.get("step")) for r in records]
    assert order.index(("train_step", 3)) < order.index(("validation", 3))
    assert results.epochs_completed == 4


def test_no_epoch_validation_with_val_every_n_epochs_none(tmp_path: Path) -> None:
    _, records = run(tmp_path, max_epochs=2, val_every_n_epochs=None, val_every_n_steps=5)
    assert [r["step"] for r in of(records, "validation")] == [5, 10, 15]


def test_max_steps_ends_the_run_mid_epoch_and_counts_that_epoch(tmp_path: Path) -> None:
    results, records = run(tmp_path, max_epochs=5, max_steps=11)
    assert results.global_step == 11 and results.epochs_completed == 2
    assert [r["step"] for r in of(records, "train_step")] == list(range(1, 12))
    assert [r["step"] for r in of(records, "epoch_end")] == [8, 11]
    assert of(records, "validation")[-1]["step"] == 11  # the last epoch is validated
    assert of(records, "run_end")[0]["global_step"] == 11


def test_the_best_checkpoint_is_kept_apart_and_holds_the_best_weights(tmp_path: Path) -> None:
    results, records = run(
        tmp_path,
        max_epochs=4,
        save_best=True,
        keep_last_n=1,
        learning_rate=0.05,
        metrics={"f1": F1Score(num_classes=2)},
    )
    validations = of(records, "validation")
    losses = [v["val_loss"] for v in validations]
    best_index = min(range(len(losses)), key=losses.__getitem__)
    assert results.monitor == "val_loss"
    assert results.best_value == pytest.approx(losses[best_index])
    best = Path(results.best_checkpoint)
    assert best.is_dir() and f"step-{validations[best_index]['step']:09d}" in best.name
    # keep_last_n=1 keeps the newest and, apart, the best.
    kept = sorted(p.name for p in best.parent.glob("step-*"))
    assert best.name in kept and Path(results.last_checkpoint).name in kept
    assert len(kept) == (1 if results.last_checkpoint == results.best_checkpoint else 2)
    assert [c["best"] for c in of(records, "checkpoint") if c["reason"] == "best"] != []
    run_end = of(records, "run_end")[0]
    assert run_end["best_checkpoint"] == results.best_checkpoint
    assert run_end["best_value"] == pytest.approx(results.best_value)
    # The weights of the best checkpoint give the best validation loss again.
    model = make_model(seed=7)
    load_weights(best, model)
    _, val_loader = loaders()
    assert val_loader is not None
    loss = sum(
        torch.nn.functional.cross_entropy(model(x), y, reduction="sum").item()
        for x, y in val_loader
    ) / len(val_loader.dataset)  # type: ignore[arg-type]
    assert loss == pytest.approx(losses[best_index], rel=1e-5)
    assert set(results.val_metrics) == {"f1"} and validations[-1]["metrics"]["f1"] is not None


def test_save_best_on_a_metric_with_mode_max(tmp_path: Path) -> None:
    results, records = run(
        tmp_path,
        max_epochs=3,
        save_best=True,
        monitor="val_f1",
        mode="max",
        metrics={"f1": F1Score(num_classes=2)},
    )
    scores = [v["metrics"]["f1"] for v in of(records, "validation")]
    assert results.best_value == pytest.approx(max(scores))


def test_save_best_on_train_loss_without_validation(tmp_path: Path) -> None:
    results, records = run(
        tmp_path, max_epochs=3, save_best=True, monitor="train_loss", val_loader=None
    )
    losses = [e["train_loss"] for e in of(records, "epoch_end")]
    assert results.best_value == pytest.approx(min(losses))


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"save_best": True, "monitor": "val_f1"}, r"monitor='val_f1'.*'val_loss'"),
        ({"save_best": True, "val_loader": None}, r"monitor='val_loss'.*without a val_loader"),
        ({"monitor": "loss"}, r"monitor='loss'.*'val_<name>'"),
        ({"mode": "maximum"}, r"mode='maximum'.*'min' or 'max'"),
        ({"max_steps": 0}, r"max_steps=0.*None or an integer >= 1"),
        ({"val_every_n_steps": True}, r"val_every_n_steps=True"),
        ({"profile_steps": (1, 1, 0)}, r"profile_steps=\(1, 1, 0\).*active >= 1"),
        ({"metrics": {"f 1": F1Score(num_classes=2)}}, r"metrics"),
    ],
)
def test_bad_settings_are_named_at_creation(
    tmp_path: Path, settings: dict[str, Any], match: str
) -> None:
    train_loader, val_loader = loaders()
    settings.setdefault("val_loader", val_loader)
    with pytest.raises(ConfigError, match=match):
        create_optimized_training_optimizer(
            model=make_model(), train_loader=train_loader, log_dir=tmp_path, **settings
        )


@pytest.mark.anyio
async def test_evaluate_and_predict_after_training(tmp_path: Path) -> None:
    train_loader, val_loader = loaders()
    config = TrainingConfig().replace(
        {"run.log_dir": str(tmp_path), "run.max_epochs": 2, "logging.reports": False}
    )
    async with OptimizedTrainingOptimizer(
        config,
        model=make_model(),
        train_loader=train_loader,
        val_loader=val_loader,
        metrics={"f1": F1Score(num_classes=2)},
    ) as job:
        results = await job.train()
        scores = await job.evaluate()
        assert scores["loss"] == pytest.approx(results.val_loss)
        assert scores["accuracy"] == pytest.approx(results.val_accuracy)
        assert scores["f1"] == pytest.approx(results.val_metrics["f1"])
        assert scores["samples"] == 64
        test = DataLoader(make_classification(40, seed=3), batch_size=16)
        outputs = await job.predict(test)
        assert [o.shape for o in outputs] == [(16, 2), (16, 2), (8, 2)]
        model = job.model
        with torch.no_grad():
            expected = model(torch.cat([x for x, _ in test]))
        assert torch.allclose(torch.cat(outputs), expected)
        assert model.training  # restored for the next train()


def raising_at_validation_call(call: int, function: Any) -> Any:
    """``function``, raising ValueError at its ``call``-th call under no_grad (a validation)."""
    calls = [0]

    def wrapped(*args: Any) -> Any:
        calls[0] += not torch.is_grad_enabled()
        if calls[0] == call and not torch.is_grad_enabled():
            raise ValueError("cannot score this batch")
        return function(*args)

    return wrapped


def cross_entropy_step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])


@pytest.mark.parametrize(
    ("settings", "function"),
    [
        (
            {"validation_step": raising_at_validation_call(6, cross_entropy_step)},
            "validation_step",
        ),
        (
            {"loss_fn": raising_at_validation_call(6, torch.nn.functional.cross_entropy)},
            "loss_fn",
        ),
        (
            {"metrics": {"hits": raising_at_validation_call(6, lambda o, t: o.argmax(1) == t)}},
            "metric 'hits'",
        ),
    ],
    ids=["validation_step", "loss_fn", "metric"],
)
def test_a_validation_that_raises_keeps_the_finished_steps_and_says_where(
    tmp_path: Path, settings: dict[str, Any], function: str
) -> None:
    train_loader, val_loader = loaders(n=256, batch_size=32)  # 2 validation batches
    job = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=train_loader,
        val_loader=val_loader,
        val_every_n_steps=3,  # the 6th call (2 in the sanity check): step 6, batch 1
        log_dir=tmp_path,
        progress=False,
        reports=False,
        **settings,
    )
    with pytest.raises(TrainingStepError) as caught:
        anyio.run(job.train)
    assert str(caught.value).startswith(
        f"{function} failed in epoch 0, step 6, validation batch 1: ValueError: cannot score"
    )
    assert isinstance(caught.value.__cause__, ValueError)
    saved = job.checkpoints.latest
    assert (saved.step, saved.reason) == (6, "error")
    loaded = make_model(seed=3)
    load_weights(saved.path, loaded)
    for ours, theirs in zip(
        loaded.state_dict().values(), job.model.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs)
    run_end = json.loads((job.run_dir / "events.jsonl").read_text().splitlines()[-1])
    assert (run_end["status"], run_end["global_step"]) == ("failed", 6)


def shuffled_run(tmp_path: Path, **settings: Any) -> tuple[Any, Any, list[dict[str, Any]]]:
    """Three epochs of a shuffled train loader (the order draws from torch's generator, as
    the val loader's iterator does), with a best checkpoint and early stopping."""
    train_loader, val_loader = loaders(n=256, batch_size=32, shuffle=True)
    job = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=train_loader,
        val_loader=val_loader,
        max_epochs=3,
        seed=0,
        save_best=True,
        early_stopping_patience=2,
        log_dir=tmp_path,
        progress=False,
        reports=False,
        **settings,
    )
    results = anyio.run(job.train)
    lines = (results.run_dir / "events.jsonl").read_text().splitlines()
    return job, results, [json.loads(line) for line in lines]


def test_a_sanity_check_fails_a_broken_validation_at_step_0_and_leaves_no_trace(
    tmp_path: Path,
) -> None:
    def broken(model: torch.nn.Module, batch: Any) -> Any:
        raise KeyError("labels")

    with pytest.raises(TrainingStepError) as caught:
        shuffled_run(tmp_path / "broken", validation_step=broken)
    assert str(caught.value).startswith(
        "validation_step failed in epoch 0, step 0, validation batch 0: KeyError"
    )
    (run_dir,) = (tmp_path / "broken" / "experiment").glob("*/events.jsonl")
    records = [json.loads(line) for line in run_dir.read_text().splitlines()]
    assert not of(records, "train_step")  # failed before the first step, not after an epoch
    assert (records[-1]["status"], records[-1]["global_step"]) == ("failed", 0)

    # Two batches before training, and every cache-clearing point of the validations after
    # it, change nothing: the same weights, validations, best checkpoint and stopping state
    # as a run without either.
    checked, results, records = shuffled_run(
        tmp_path / "checked", clear_cache_every_n_val_batches=1
    )
    plain, plain_results, plain_records = shuffled_run(
        tmp_path / "plain", num_sanity_val_steps=0, clear_cache_every_n_val_batches=None
    )
    (sanity,) = of(records, "sanity_check")
    assert (sanity["step"], sanity["batches"], sanity["samples"]) == (0, 2, 64)
    assert records.index(sanity) < records.index(of(records, "train_step")[0])
    assert not of(plain_records, "sanity_check")
    for ours, theirs in zip(
        checked.model.state_dict().values(), plain.model.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs)

    def history(records: list[dict[str, Any]]) -> list[Any]:
        return [(r["step"], r["val_loss"], r["val_accuracy"]) for r in of(records, "validation")]

    assert history(records) == history(plain_records) and len(history(records)) == 3
    assert [r["early_stopping_bad_epochs"] for r in of(records, "epoch_end")] == [
        r["early_stopping_bad_epochs"] for r in of(plain_records, "epoch_end")
    ]
    assert results.best_value == plain_results.best_value
    best_steps = [Path(r.best_checkpoint).name.split("-")[1] for r in (results, plain_results)]
    assert best_steps[0] == best_steps[1]  # step-<step>-<time>-<id>: the same step
    assert [r["cache_clears"] for r in of(records, "validation")] == [2, 2, 2]  # 2 batches each
    assert [r["cache_clears"] for r in of(plain_records, "validation")] == [0, 0, 0]
