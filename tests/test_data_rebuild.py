"""A run's own DataLoader, left at num_workers=0, is rebuilt with data.loader's workers
(founding document 001's parallel loading): same batches, same weights, exact resume, and
run_start says what was applied to each loader, or why not."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    get_worker_info,
)

from core import TrainingConfig, create_optimized_training_optimizer
from core.data import LoaderConfig
from core.data.config import DataConfig
from core.data.rebuild import rebuild_loader
from tests.helpers import make_classification, make_model


class Decoded(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Map-style samples made in ``__getitem__``; counts those the training process made."""

    def __init__(self) -> None:
        self.data = make_classification(96)
        self.in_process = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if get_worker_info() is None:
            self.in_process += 1  # a worker's count stays in its own copy
        x, y = self.data[i]
        return x * 1.0, y


def train(log_dir: Path, data: DataConfig, experiment: str, epochs: int) -> tuple[Any, Decoded]:
    dataset = Decoded()
    run = create_optimized_training_optimizer(
        model=make_model(seed=5),
        train_loader=DataLoader(dataset, batch_size=16, shuffle=True),
        val_loader=DataLoader(make_classification(32, seed=1), batch_size=16),
        config=TrainingConfig(data=data),
        max_epochs=epochs,
        learning_rate=1e-2,
        seed=7,
        log_dir=log_dir,
        experiment_name=experiment,
        resume="auto",
    )
    asyncio.run(run.train())
    return run, dataset


def records(run: Any, event: str) -> list[dict[str, Any]]:
    lines = (run.run_dir / "events.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def test_a_loader_left_in_process_gets_workers_same_weights_and_an_exact_resume(
    log_dir: Path,
) -> None:
    given, given_data = train(log_dir, DataConfig(rebuild_loaders=False), "given", 2)
    assert given_data.in_process == 2 * 96  # as given: loaded in the training process
    (start,) = records(given, "run_start")
    assert start["loaders"]["train"] == {"rebuilt": False, "reason": "data.rebuild_loaders=False"}

    workers = DataConfig(loader=LoaderConfig(num_workers=2))
    first, first_data = train(log_dir, workers, "rebuilt", 1)
    resumed, resumed_data = train(log_dir, workers, "rebuilt", 2)  # continues epoch 1
    assert first_data.in_process == resumed_data.in_process == 0  # loaded by the workers
    (start,) = records(first, "run_start")
    assert start["loaders"] == {
        "train": {
            "rebuilt": True,
            "num_workers": 2,
            "prefetch_factor": 2,
            "pin_memory": False,  # CPU
            "persistent_workers": False,
            "start_method": "fork",  # quick to start, in a training process too
        },
        "val": {"rebuilt": False, "reason": "a TensorDataset: nothing to load in parallel"},
    }
    (resume,) = records(resumed, "resumed")
    assert resume["data_order"] == "restored", resume
    assert resumed.global_step == given.global_step == 12
    for ours, theirs in zip(resumed.model.parameters(), given.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)  # same shuffles, same batches, resumed exactly


class Numbers(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


class Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(4))


class Locked(Numbers):
    def __init__(self) -> None:
        self.lock = threading.Lock()  # what a forked worker must not copy


class OwnLoader(DataLoader[torch.Tensor]):
    pass


def shuffled() -> RandomSampler:
    return RandomSampler(Numbers(), generator=torch.Generator().manual_seed(0))


def test_every_batching_form_keeps_its_batches_and_unsafe_loaders_stay_as_given() -> None:
    forms = {
        "batch_size": lambda: DataLoader(Numbers(), batch_size=3, sampler=shuffled()),
        "batch_sampler": lambda: DataLoader(
            Numbers(), batch_sampler=BatchSampler(shuffled(), 4, False)
        ),
        "no batching": lambda: DataLoader(Numbers(), batch_size=None, sampler=shuffled()),
    }
    config = LoaderConfig(num_workers=2)
    for form, make in forms.items():
        rebuilt, applied = rebuild_loader(make(), config, device=torch.device("cpu"))
        assert applied["rebuilt"] and isinstance(rebuilt, DataLoader), form
        assert rebuilt.num_workers == 2, form
        assert [b.tolist() for b in rebuilt] == [b.tolist() for b in make()], form
    kept = {
        "num_workers=1 was set on the loader": DataLoader(Numbers(), num_workers=1),
        "an IterableDataset": DataLoader(Stream()),
        "a OwnLoader, not a DataLoader": OwnLoader(Numbers()),
        "its dataset does not pickle (TypeError: cannot pickle '_thread.lock'": DataLoader(
            Locked()
        ),
        "resolves to 0": DataLoader(Numbers()),
    }
    for reason, loader in kept.items():
        workers = LoaderConfig(num_workers=0) if reason == "resolves to 0" else config
        same, applied = rebuild_loader(loader, workers, device=torch.device("cpu"))
        assert same is loader and not applied["rebuilt"] and reason in applied["reason"]
