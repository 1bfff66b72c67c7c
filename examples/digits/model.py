"""Small classifiers for 8x8 digit images: a two-layer CNN (the default) and an MLP."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DigitsCNN", "DigitsMLP", "build_model"]


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, one 2x2 max-pool, then a two-layer head: ``[N, 1, 8, 8]`` ->
    ``[N, 10]`` logits. About 70k parameters at ``width=16``."""

    def __init__(self, width: int = 16, hidden: int = 128, dropout: float = 0.1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 4 * 4, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, 10),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))  # type: ignore[no-any-return]


class DigitsMLP(nn.Module):
    """Flattened pixels through one hidden layer: ``[N, 1, 8, 8]`` -> ``[N, 10]`` logits."""

    def __init__(self, hidden: int = 128, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, 10),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)  # type: ignore[no-any-return]


def build_model(kind: str = "cnn", **kwargs: float) -> nn.Module:
    """The model factory of ``core-train --example digits`` (``--model-arg kind=mlp``,
    ``--model-arg width=32``...)."""
    if kind == "cnn":
        return DigitsCNN(**kwargs)  # type: ignore[arg-type]
    if kind == "mlp":
        return DigitsMLP(**kwargs)  # type: ignore[arg-type]
    raise ValueError(f"kind must be 'cnn' or 'mlp', got {kind!r}")
