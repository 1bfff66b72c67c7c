"""The jobs tests/test_devices_launch.py trains in two ranks (``devices=2``), and the
reference that torchrun runs: ``torchrun --standalone --nproc-per-node 2
tests/devices_parts.py OUT`` trains the same job and rank 0 writes ``OUT/results.json`` and
``OUT/weights.pt`` (the model's full weights)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from core import create_optimized_training_optimizer
from tests import isolation_parts as parts


def loaders(batch_size: int, num_workers: int) -> tuple[DataLoader[Any], DataLoader[Any]]:
    """The command line's data factory (``--data tests.devices_parts:loaders``)."""
    train = DataLoader(parts.make_data(), batch_size=batch_size, shuffle=True)
    return train, DataLoader(parts.make_data(32), batch_size=batch_size)


def build(log_dir: Path, **kwargs: Any) -> Any:
    """The Python API's job: two ranks, started by ``train()`` itself outside torchrun."""
    settings: dict[str, Any] = {
        "model": parts.make_model(),
        "train_loader": parts.make_loader(),
        "val_loader": parts.make_val_loader(),
        "optimizer": parts.sgd,
        "max_epochs": 2,
        "seed": 3,
        "log_dir": log_dir,
        "experiment_name": "devices",
        "progress": False,
        "reports": False,
        "devices": 2,
        **kwargs,
    }
    return create_optimized_training_optimizer(**settings)


async def reference(out: Path) -> None:
    """One rank of the torchrun job (``devices=2`` is what torchrun started: nothing more)."""
    job = build(out / "logs")
    async with job:
        results = await job.train()
        weights = job.multi_gpu_trainer.strategy.model_state_dict(job.model)
        if job.rank == 0:
            (out / "results.json").write_text(json.dumps(results.to_dict()))
            torch.save(weights, out / "weights.pt")


if __name__ == "__main__":
    asyncio.run(reference(Path(sys.argv[1])))
