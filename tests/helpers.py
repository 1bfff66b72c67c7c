"""Tiny models and loaders that train in well under a second on CPU."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_classification(n: int = 256, features: int = 8, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return TensorDataset(x, y)


def make_model(features: int = 8, hidden: int = 16, classes: int = 2, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, classes))


def loaders(
    n: int = 256, batch_size: int = 32, shuffle: bool = False, val: bool = True
) -> tuple[DataLoader[Any], DataLoader[Any] | None]:
    train = DataLoader(make_classification(n), batch_size=batch_size, shuffle=shuffle)
    valid = DataLoader(make_classification(64, seed=1), batch_size=32) if val else None
    return train, valid


VOCAB = 11


def padded_sequences(n: int = 4, length: int = 6, seed: int = 0) -> TensorDataset:
    """Token sequences padded with -100 to ``length``: sequence i keeps ``i % length + 1``
    tokens, so batches hold very different numbers of real target tokens."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (n, length), generator=generator)
    targets = torch.randint(0, VOCAB, (n, length), generator=generator)
    for i in range(n):
        targets[i, (i * 5) % length + 1 :] = -100
    return TensorDataset(tokens, targets)


class TokenModel(nn.Module):
    """Embedding -> linear over the vocabulary; outputs ``[batch, vocab, time]``."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.embed(tokens)).transpose(1, 2)
        return out


ROOT = Path(__file__).resolve().parents[1]


def pythonpath() -> str:
    """``PYTHONPATH`` for a child process: the project first, then what the parent had (a
    machine may name its installed packages there: never replace it)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def eventually(path: Path, timeout_s: float = 60.0) -> Path:
    """``path`` once it exists: files a background process writes (a run's reports, after
    its training process has exited); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.05)
    return path


def train_steps(out: Path, experiment: str = "faults") -> int:
    """``train_step`` records the runs under ``out/logs/<experiment>`` have written so far."""
    runs = out / "logs" / experiment
    logs = runs.glob("*/events.jsonl") if runs.exists() else []
    return sum(log.read_text().count('"event":"train_step"') for log in logs)


def wait_for(
    condition: Callable[[], Any], process: subprocess.Popen[str], timeout: float = 60
) -> None:
    """Until ``condition()``; fails (with its output) if ``process`` ends first, or after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline
        time.sleep(0.02)
