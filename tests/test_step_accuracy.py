"""Each ``train_step`` record's ``accuracy``: the step's own batches, counted on the device and
read back with the loss one step late; a ``training_step``'s ``outputs`` count too, and
``step_accuracy=False`` turns it off."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from core import create_optimized_training_optimizer
from tests.helpers import make_classification, make_model


def step_records(
    log_dir: Path, model: nn.Module, loader: DataLoader[Any], **kwargs: Any
) -> list[dict[str, Any]]:
    """The ``train_step`` records of one epoch, read from the run's ``events.jsonl``; SGD at
    lr 0 keeps the weights, so each batch's accuracy can be counted again afterwards."""
    job = create_optimized_training_optimizer(
        model=model,
        train_loader=loader,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        max_epochs=1,
        seed=0,
        log_dir=log_dir,
        progress=False,
        reports=False,
        **kwargs,
    )
    asyncio.run(job.train())
    (events,) = log_dir.rglob("events.jsonl")
    records = [json.loads(line) for line in events.read_text().splitlines()]
    return [r for r in records if r["event"] == "train_step"]


def test_each_step_record_holds_the_accuracy_of_its_own_batches(tmp_path: Path) -> None:
    model = make_model()
    loader = DataLoader(make_classification(96), batch_size=16)
    with torch.no_grad():
        hits = [float((model(x).argmax(1) == y).sum()) for x, y in loader]

    # One batch a step: the inline step, the default cross-entropy objective.
    inline = step_records(tmp_path / "inline", model, loader)
    assert [r["accuracy"] for r in inline] == [h / 16 for h in hits]
    assert len(set(hits)) > 1  # the batches differ: a record of another step would not match

    # Two batches a step, the scores returned by a training_step as its outputs.
    def training_step(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        inputs, targets = batch
        scores = model(inputs)
        return {"loss": F.cross_entropy(scores, targets), "outputs": scores}

    windowed = step_records(
        tmp_path / "windowed",
        model,
        loader,
        training_step=training_step,
        accumulation_steps=2,
    )
    assert [r["accuracy"] for r in windowed] == [
        (hits[i] + hits[i + 1]) / 32 for i in range(0, len(hits), 2)
    ]

    off = step_records(tmp_path / "off", model, loader, step_accuracy=False)
    assert [r["accuracy"] for r in off] == [None] * len(hits)
    assert [r["loss"] for r in off] == [r["loss"] for r in inline]
