from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch.utils.data import DataLoader

from core import (
    CheckpointConfig,
    CheckpointError,
    ConfigError,
    GradientAccumulationConfig,
    IncompatibleCheckpointError,
    create_optimized_training_optimizer,
)
from core.checkpointing.store import CheckpointStore
from tests.helpers import make_classification, make_model


def commit(store: CheckpointStore, step: int, payload: Any = None) -> Path:
    staging = store.stage(step)
    store.write_state(staging, {"step": step, "payload": payload})
    return store.commit(staging, step, {"epoch": 0, "reason": "test"})


def test_commit_publishes_verified_checkpoints_and_prunes_after_committing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last_n=2)
    for step in (1, 2, 3):
        commit(store, step, torch.arange(step))
    assert [p.name for p in store.committed()] == [
        f"step-000000003-{store.run_id}",
        f"step-000000002-{store.run_id}",
    ]
    manifest = store.verify(store.committed()[0])
    assert manifest["step"] == 3 and set(manifest["files"]) == {"state.pt"}
    assert torch.equal(store.load_state(store.committed()[0])["payload"], torch.arange(3))
    assert not [p for p in tmp_path.iterdir() if ".staging-" in p.name]


def test_a_missing_file_or_an_altered_byte_fails_verification(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last_n=3)
    good, bad = commit(store, 1), commit(store, 2)
    data = bytearray((bad / "state.pt").read_bytes())
    data[-10] ^= 0xFF
    (bad / "state.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"state.pt has sha256 .* the manifest says"):
        store.verify(bad)
    reported: list[tuple[Path, str]] = []
    assert store.newest_valid(lambda path, reason: reported.append((path, reason))) == good
    assert reported[0][0] == bad
    (good / "state.pt").unlink()
    with pytest.raises(CheckpointError, match=r"is missing state\.pt"):
        store.verify(good)


def test_only_staging_of_a_writer_that_is_provably_gone_is_swept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last_n=2)
    live = store.stage(9)  # this process: alive
    store.write_state(live, {"half": True})
    dead_pid = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    host = socket.gethostname()
    dead = tmp_path / f".step-000000009-x.staging-{host}-{dead_pid}-ab12"
    elsewhere = tmp_path / ".step-000000009-y.staging-otherhost-1-ab12"
    dead.mkdir()
    elsewhere.mkdir()
    assert store.committed() == []
    assert store.sweep() == [dead]
    assert live.exists() and elsewhere.exists() and not dead.exists()


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"checkpoint_every_n_steps": 0}, r"checkpoint_every_n_steps=0 is invalid"),
        ({"keep_last_n": 0}, r"keep_last_n=0 is invalid"),
        (
            {"resume": 3},
            r"resume=3 is invalid; allowed: None, 'auto', 'strict' or the path of a checkpoint",
        ),
    ],
)
def test_config_errors(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        CheckpointConfig(**kwargs)


def build(log_dir: Path, **kwargs: Any) -> Any:
    return create_optimized_training_optimizer(
        model=make_model(),
        train_loader=DataLoader(make_classification(96), batch_size=16),
        max_epochs=kwargs.pop("max_epochs", 2),
        log_dir=log_dir,
        **kwargs,
    )


def test_a_strict_resume_with_an_incompatible_config_names_the_fields(log_dir: Path) -> None:
    anyio.run(build(log_dir).train)
    changed = build(
        log_dir,
        resume="strict",
        gradient_accumulation_config=GradientAccumulationConfig(2),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
    )
    with pytest.raises(
        IncompatibleCheckpointError,
        match=r"differs in accumulation_steps \(checkpoint 1, now 2\), "
        r"learning_rate \(checkpoint 0.001, now 0.1\), optimizer \(checkpoint 'AdamW', now 'SGD'\)",
    ):
        anyio.run(changed.train)


def test_resume_from_an_explicit_path_and_training_longer(log_dir: Path) -> None:
    first = build(log_dir, max_epochs=1)
    anyio.run(first.train)
    (path,) = [c.path for c in first.checkpoints]
    longer = build(log_dir, max_epochs=3, resume=str(path))
    results = anyio.run(longer.train)
    assert results.epochs_completed == 3 and results.global_step == 3 * 6
    records = [json.loads(x) for x in (results.run_dir / "events.jsonl").read_text().splitlines()]
    resumed = next(r for r in records if r["event"] == "resumed")
    assert resumed["step"] == 6 and resumed["path"] == str(path)
    assert [r["epoch"] for r in records if r["event"] == "epoch_end"] == [1, 2]


def test_an_explicit_path_that_fails_verification_is_an_error(
    log_dir: Path, tmp_path: Path
) -> None:
    bogus = tmp_path / "step-000000001"
    bogus.mkdir()
    with pytest.raises(CheckpointError, match="has no readable manifest"):
        anyio.run(build(log_dir, resume=str(bogus)).train)
