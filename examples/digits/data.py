"""scikit-learn's digits as tensors: 1797 images of 8x8 pixels, split once, deterministically."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from core import LoaderConfig, create_dataloader

__all__ = ["IMAGE_SHAPE", "NUM_CLASSES", "build_data", "digits_datasets"]

NUM_CLASSES = 10
IMAGE_SHAPE = (1, 8, 8)
_MAX_PIXEL = 16.0  # the dataset's pixels are counts 0..16


def digits_datasets(
    val_fraction: float = 0.2, seed: int = 0
) -> tuple[TensorDataset, TensorDataset]:
    """``(train, val)``: images ``[1, 8, 8]`` scaled to [0, 1] and labels ``0..9``, split by a
    permutation drawn from a private generator seeded with ``seed`` (the same split every
    time; the global RNG is not touched)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ImportError(
            "the digits example needs scikit-learn: pip install -e '.[examples]'"
        ) from exc
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / _MAX_PIXEL
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_val = round(len(labels) * val_fraction)
    val, train = order[:n_val], order[n_val:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


def build_data(
    batch_size: int = 32, num_workers: int = 0
) -> tuple[DataLoader[Any], DataLoader[Any]]:
    """The data factory of ``core-train --example digits``: shuffled training batches of
    ``batch_size`` (1437 images) and validation batches of 256 (360 images)."""
    train, val = digits_datasets()
    config = LoaderConfig(num_workers=num_workers)
    return (
        create_dataloader(train, batch_size, shuffle=True, config=config),
        create_dataloader(val, 256, config=config),
    )
