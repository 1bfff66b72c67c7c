"""Parts of the jobs that tests/test_process_isolation.py trains in a child process: module
level, so they pickle, and importable as factories (``"tests.isolation_parts:make_model"``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.2), nn.Tanh(), nn.Linear(32, 2))


def make_data(n: int = 96) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] * x[:, 1] > 0).long())


def make_loader() -> DataLoader[Any]:
    return DataLoader(make_data(), batch_size=8, shuffle=True)


def make_val_loader() -> DataLoader[Any]:
    return DataLoader(make_data(32), batch_size=8)


class SlowData(TensorDataset):
    """``make_data()``, taking ``delay_s`` per sample."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(*make_data().tensors)
        self.delay_s = delay_s

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        time.sleep(self.delay_s)
        return super().__getitem__(index)


def shuffled_by_its_generator(delay_s: float = 0.0) -> DataLoader[Any]:
    """``make_loader()``'s batches, shuffled by a generator of the loader's own."""
    generator = torch.Generator().manual_seed(5)
    return DataLoader(SlowData(delay_s), batch_size=8, shuffle=True, generator=generator)


def sgd(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)


class SlowLoader:
    """A loader taking ``delay_s`` per batch: time for a test to cancel mid-epoch."""

    def __init__(self, delay_s: float = 0.02) -> None:
        self.loader, self.delay_s = make_loader(), delay_s

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            time.sleep(self.delay_s)
            yield batch


class GatedLoader:
    """A loader that, before its ``at``-th batch, creates the file ``waiting`` and waits
    until the file ``gate`` exists (files: the loader runs in the training process)."""

    def __init__(self, waiting: Path, gate: Path, at: int) -> None:
        self.loader, self.waiting, self.gate, self.at = make_loader(), waiting, gate, at

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for index, batch in enumerate(self.loader):
            if index == self.at:
                self.waiting.touch()
                while not self.gate.exists():
                    time.sleep(0.01)
            yield batch


def other_model() -> nn.Module:
    """Another model for the same data (its checkpoints are not the first one's)."""
    torch.manual_seed(6)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))


class Big(nn.Module):
    """About 2 MiB of weights: more than a 1 MiB disk holds."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wide = nn.Linear(8, 65536)
        self.out = nn.Linear(65536, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(torch.tanh(self.wide(x)))
        return out


def killed_while_building() -> nn.Module:
    """A model whose building, in a training process, ends it as the OOM killer would."""
    if multiprocessing.parent_process() is not None:
        os.kill(os.getpid(), signal.SIGKILL)
    return make_model()


def cross_entropy_step(model: nn.Module, batch: Any) -> dict[str, Any]:
    """A ``training_step`` of the built-in objective, logging twice its loss."""
    inputs, targets = batch
    outputs = model(inputs)
    loss = torch.nn.functional.cross_entropy(outputs, targets)
    return {"loss": loss, "double": 2 * loss, "outputs": outputs}
