"""Seed 003's example: scikit-learn's digits split deterministically, models that classify
them, and the example script reaching 97% validation accuracy on CPU with its results files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("sklearn")

from examples.digits import IMAGE_SHAPE, NUM_CLASSES, build_data, build_model, digits_datasets
from examples.gpu_training_example import main as gpu_training_example


def test_the_split_is_deterministic_and_shaped_as_documented() -> None:
    (train, val), (train2, _) = digits_datasets(), digits_datasets()
    assert len(train) + len(val) == 1797 and len(val) == 359
    assert torch.equal(train.tensors[0], train2.tensors[0])
    images, _label = train[0]
    assert images.shape == IMAGE_SHAPE and 0.0 <= float(images.min()) <= float(images.max()) <= 1.0
    assert set(val.tensors[1].tolist()) == set(range(NUM_CLASSES))
    train_loader, val_loader = build_data(batch_size=32, num_workers=0)
    assert len(train_loader) == 45 and len(val_loader) == 2


@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_models_return_ten_logits_per_image(kind: str) -> None:
    logits = build_model(kind)(torch.zeros(3, *IMAGE_SHAPE))
    assert logits.shape == (3, NUM_CLASSES)


def test_an_unknown_model_kind_is_named() -> None:
    with pytest.raises(ValueError, match="kind must be 'cnn' or 'mlp', got 'rnn'"):
        build_model("rnn")


@pytest.mark.slow
def test_the_gpu_training_example_reaches_97_percent_and_writes_its_results(
    tmp_path: Path,
) -> None:
    results = tmp_path / "results"
    code = gpu_training_example(
        [
            "--results-dir",
            str(results),
            "--log-dir",
            str(tmp_path / "logs"),
            "--epochs",
            "6",
            "--num-workers",
            "0",
            "--no-progress",
            "--gpu-mode",
            "cpu",
        ]
    )
    assert code == 0
    summary = json.loads((results / "results.json").read_text())
    assert summary["val_accuracy"] >= 0.97 and summary["epochs_completed"] == 6
    assert (results / "performance_summary.txt").read_text().startswith("Performance summary")
    assert summary["best_checkpoint"] is not None  # examples/digits/config.toml: save_best
