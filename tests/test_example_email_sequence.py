"""The example a user copies from: deterministic data, a model that learns, a runnable script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import torch

from examples.email_sequence import EmailSequenceDataset, EmailSequenceModel, majority_class_rate
from examples.email_sequence.train import main, parse_args


def test_dataset_is_deterministic_by_seed_and_shaped_as_documented() -> None:
    a, b, c = (
        EmailSequenceDataset(64, seed=3),
        EmailSequenceDataset(64, seed=3),
        EmailSequenceDataset(64, seed=4),
    )
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.inputs, c.inputs)
    inputs, label = a[0]
    assert inputs.shape == (a.max_emails, a.subject_len + 2) and inputs.dtype == torch.long
    assert label.ndim == 0 and 0.5 < majority_class_rate(EmailSequenceDataset(2000)) < 0.7


def test_bad_dataset_argument_is_named() -> None:
    with pytest.raises(ValueError, match="max_emails"):
        EmailSequenceDataset(10, max_emails=2)


def test_model_returns_logits_per_recipient() -> None:
    data = EmailSequenceDataset(4)
    logits = EmailSequenceModel()(data.inputs)
    assert logits.shape == (4, 2) and logits.dtype == torch.float32


def test_train_script_learns_above_the_majority_class(tmp_path: Path) -> None:
    args = parse_args(
        [
            "--epochs",
            "3",
            "--train-samples",
            "3000",
            "--val-samples",
            "600",
            "--log-dir",
            str(tmp_path),
            "--no-progress",
        ]
    )
    summary = anyio.run(main, args)
    assert summary["val_accuracy"] > summary["majority_class_rate"] + 0.1
    assert (Path(summary["run_dir"]) / "results.json").exists()


@pytest.mark.distributed
def test_train_script_runs_unchanged_under_torchrun(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(root / "examples" / "email_sequence" / "train.py"),
        "--epochs",
        "1",
        "--train-samples",
        "800",
        "--val-samples",
        "200",
        "--log-dir",
        str(tmp_path),
        "--no-progress",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (p for p in (tmp_path / "email_sequence").iterdir() if p.name != "checkpoints")
    names = {p.name for p in run_dir.iterdir()}
    assert {"events.jsonl", "events.rank1.jsonl", "results.json"} <= names
    start = json.loads((run_dir / "events.jsonl").read_text().splitlines()[0])
    assert start["resolved"]["strategy"]["training_mode"] == "distributed"
    assert start["resolved"]["strategy"]["world_size"] == 2
    assert "val_accuracy=" in done.stdout
