"""Seeding every random number generator a training run touches."""

from __future__ import annotations

import random

import torch

__all__ = ("seed_everything",)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's (when installed) and torch's generators (CPU and CUDA)."""
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    try:
        import numpy as np
    except ImportError:  # NumPy is optional
        return
    np.random.seed(seed % 2**32)
