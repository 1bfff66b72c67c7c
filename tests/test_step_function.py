"""``training_step(model, batch)`` and ``validation_step``: a step written by the user, run
inside core's precision, accumulation, retry and guards, its logged values read back lagged."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core import create_optimized_training_optimizer, load_weights
from core.errors import LossFormatError, TrainingStepError
from core.trackers.convert import scalars_of
from tests import isolation_parts as parts
from tests.helpers import loaders, make_model


def train(log_dir: Path, **kwargs: Any) -> tuple[Any, Any, list[dict[str, Any]]]:
    train_loader, val_loader = loaders(n=64, batch_size=16)
    settings: dict[str, Any] = {
        "model": make_model(),
        "train_loader": train_loader,
        "val_loader": val_loader,
        "max_epochs": 2,
        "seed": 0,
        "log_dir": log_dir,
        "progress": False,
        **kwargs,
    }
    job = create_optimized_training_optimizer(**settings)

    async def main() -> tuple[Any, list[dict[str, Any]]]:
        records: list[dict[str, Any]] = []
        stream = job.events()

        async def consume() -> None:
            async for record in stream:
                records.append(record)

        consumer = asyncio.create_task(consume())
        results = await job.train()
        await consumer
        return results, records

    results, records = asyncio.run(main())
    return job, results, records


def of(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == event]


def test_a_step_function_trains_the_same_weights_as_the_loss_fn_it_computes(
    tmp_path: Path,
) -> None:
    def step(model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return F.cross_entropy(model(inputs), targets)

    builtin, _, _ = train(tmp_path / "a", loss_fn=nn.CrossEntropyLoss())
    stepped, results, records = train(tmp_path / "b", training_step=step)
    for ours, theirs in zip(
        stepped.model.state_dict().values(), builtin.model.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs)
    assert results.global_step == 8
    assert all("logged" not in r for r in of(records, "train_step"))


@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_logged_values_reach_the_step_records_validation_and_trackers(
    tmp_path: Path, accumulation_steps: int
) -> None:
    _, results, records = train(
        tmp_path,
        training_step=parts.cross_entropy_step,
        accumulation_steps=accumulation_steps,
        save_best=True,
        monitor="val_double",
    )
    steps = of(records, "train_step")
    assert len(steps) == 8 // accumulation_steps
    for record in steps:  # the window's sample-weighted mean, like the loss
        assert record["logged"]["double"] == pytest.approx(2 * record["loss"], rel=1e-6)
    assert "train/double" in [s.name for s in scalars_of(steps[0])]
    validations = of(records, "validation")
    for record in validations:
        assert record["metrics"]["double"] == pytest.approx(2 * record["val_loss"], rel=1e-6)
        assert record["val_accuracy"] is not None  # from the step's "outputs"
    assert results.monitor == "val_double"
    assert results.best_value == min(r["metrics"]["double"] for r in validations)


def test_a_validation_step_evaluates_and_a_distillation_step_trains(tmp_path: Path) -> None:
    torch.manual_seed(1)
    teacher = make_model(seed=7).eval()

    def distill(model: nn.Module, batch: Any) -> dict[str, Any]:
        inputs, targets = batch
        logits = model(inputs)
        with torch.no_grad():
            soft = F.softmax(teacher(inputs) / 2.0, dim=-1)
        kd = F.kl_div(F.log_softmax(logits / 2.0, dim=-1), soft, reduction="batchmean")
        ce = F.cross_entropy(logits, targets)
        return {"loss": 0.5 * ce + 0.5 * kd, "ce": ce, "kd": kd}

    def validation_step(model: nn.Module, batch: Any) -> dict[str, Any]:
        inputs, targets = batch
        logits = model(inputs)
        wrong = (logits.argmax(-1) != targets).float().mean()
        return {"loss": F.cross_entropy(logits, targets), "error_rate": wrong}

    job, _, records = train(tmp_path, training_step=distill, validation_step=validation_step)
    assert set(of(records, "train_step")[0]["logged"]) == {"ce", "kd"}
    last = of(records, "validation")[-1]
    assert set(last["metrics"]) == {"error_rate"} and last["val_accuracy"] is None
    evaluated = asyncio.run(job.evaluate())
    assert evaluated["error_rate"] == pytest.approx(last["metrics"]["error_rate"])


def test_a_dict_without_a_loss_says_what_to_return(tmp_path: Path) -> None:
    def step(model: nn.Module, batch: Any) -> dict[str, Any]:
        return {"ce": F.cross_entropy(model(batch[0]), batch[1])}

    with pytest.raises(LossFormatError, match=r"training_step returned a dict without 'loss'"):
        train(tmp_path, training_step=step)

    def vector(model: nn.Module, batch: Any) -> dict[str, Any]:
        loss = F.cross_entropy(model(batch[0]), batch[1])
        return {"loss": loss, "per_sample": model(batch[0])[:, 0]}

    with pytest.raises(LossFormatError, match=r"'per_sample' = .*allowed: scalar tensors"):
        train(tmp_path / "v", training_step=vector)


@pytest.mark.slow
def test_a_step_function_named_by_a_factory_trains_in_a_process(tmp_path: Path) -> None:
    _, results, records = train(
        tmp_path, training_step="tests.isolation_parts:cross_entropy_step", isolation="process"
    )
    assert results.global_step == 8
    assert all("double" in r["logged"] for r in of(records, "train_step"))


def malformed_at(call: int, returned: Any) -> Any:
    """A step function that returns ``returned(loss)`` (or raises it) at its ``call``-th call."""
    calls = [0]

    def step(model: nn.Module, batch: Any) -> Any:
        calls[0] += 1
        loss = F.cross_entropy(model(batch[0]), batch[1])
        if calls[0] != call:
            return loss
        if isinstance(returned, Exception):
            raise returned
        return returned(loss)

    return step


@pytest.mark.parametrize(
    ("returned", "error", "match"),
    [
        (lambda loss: None, LossFormatError, r"training_step returned NoneType in"),
        (lambda loss: loss.expand(4), LossFormatError, r"training_step returned Tensor\(shape"),
        (lambda loss: {"ce": loss}, LossFormatError, r"training_step returned a dict without"),
        (ValueError("no such token"), TrainingStepError, r"training_step failed in"),
    ],
    ids=["none", "vector", "dict-without-loss", "raises"],
)
def test_a_failing_step_function_keeps_the_finished_steps_and_says_where(
    tmp_path: Path, returned: Any, error: type[Exception], match: str
) -> None:
    settings = {"model": make_model(), "train_loader": loaders(n=64, batch_size=16)[0]}
    job = create_optimized_training_optimizer(
        **settings, training_step=malformed_at(7, returned), log_dir=tmp_path, progress=False
    )  # 4 steps per epoch: the 7th call is epoch 1's 3rd batch
    with pytest.raises(error, match=match + r".* epoch 1, step 7, batch 2\b"):
        asyncio.run(job.train())
    saved = job.checkpoints.latest
    assert (saved.step, saved.reason) == (6, "error")  # the last completed step
    loaded = make_model(seed=3)
    load_weights(saved.path, loaded)  # the weights the run stopped with
    for ours, theirs in zip(
        loaded.state_dict().values(), job.model.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs)
    lines = (Path(job.run_dir) / "events.jsonl").read_text().splitlines()
    run_end = json.loads(lines[-1])
    assert run_end["status"] == "failed" and run_end["global_step"] == 6
    assert run_end["last_checkpoint"] == str(saved.path)


def accuracy_only(model: nn.Module, batch: Any) -> dict[str, Any]:
    """A Lightning-style validation_step that logs a metric and no loss."""
    inputs, targets = batch
    return {"acc": (model(inputs).argmax(-1) == targets).float().mean()}


def test_a_validation_step_may_return_metrics_only_unless_val_loss_is_watched(
    tmp_path: Path,
) -> None:
    _, results, records = train(
        tmp_path / "metrics",
        validation_step=accuracy_only,
        save_best=True,
        monitor="val_acc",
        mode="max",
    )
    validations = of(records, "validation")
    assert [r["val_loss"] for r in validations] == [None, None]
    assert all(0.0 <= r["metrics"]["acc"] <= 1.0 for r in validations)
    assert of(records, "sanity_check")[0]["val_loss"] is None
    assert [r["val_loss"] for r in of(records, "epoch_end")] == [None, None]
    assert results.val_loss is None and results.best_val_loss is None
    assert results.best_value == max(r["metrics"]["acc"] for r in validations)

    # Watching val_loss (the default monitor of save_best) fails before the first step.
    with pytest.raises(LossFormatError) as caught:
        train(tmp_path / "watched", validation_step=accuracy_only, save_best=True)
    assert str(caught.value).startswith(
        "monitor='val_loss' needs a validation loss, but validation_step returned none in "
        "the sanity check before training (epoch 0, step 0)"
    )
    assert "'val_acc'" in str(caught.value)

    # A validation_step returning None is named as the validation it is.
    with pytest.raises(
        LossFormatError,
        match=r"^validation_step returned NoneType in epoch 0, step 0, validation batch 0; ",
    ):
        train(tmp_path / "none", validation_step=lambda model, batch: None)
