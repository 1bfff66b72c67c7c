"""The serving side of the model: its architecture, a served version, scoring and evaluation.

The model served is a copy on the CPU, loaded from the run's best checkpoint with
:func:`core.load_weights`: it is never the module being trained, so scoring needs no lock
and a training run cannot change it halfway through a request.

Example::

    model = build_model(seed=0)
    probability = conversion_probability(model, store.features("r42"))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from core import load_weights
from examples.email_pipeline.store import MAX_EMAILS, SUBJECT_LEN, VOCAB_SIZE
from examples.email_sequence import EmailSequenceModel

__all__ = ("ServedModel", "build_model", "conversion_probability", "evaluate", "load_served")


def build_model(seed: int = 0) -> nn.Module:
    """A fresh conversion model (the email-sequence transformer, sized for this service),
    initialised from ``seed`` without touching the global random state.

    >>> build_model(0)(torch.zeros(1, 8, 4, dtype=torch.long)).shape
    torch.Size([1, 2])
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return EmailSequenceModel(
            vocab_size=VOCAB_SIZE,
            max_emails=MAX_EMAILS,
            subject_len=SUBJECT_LEN,
            d_model=32,
            n_heads=2,
            n_layers=2,
            dropout=0.1,
        )


def conversion_probability(model: nn.Module, features: torch.Tensor) -> float:
    """P(convert) of one recipient's features (``[MAX_EMAILS, SUBJECT_LEN + 2]``).

    >>> 0.0 <= conversion_probability(build_model(), torch.zeros(8, 4, dtype=torch.long)) <= 1.0
    True
    """
    with torch.inference_mode():
        logits = model(features.unsqueeze(0))
        # a synchronous request answers with a number: reading it back is the point (CPU)
        return float(F.softmax(logits.float(), dim=-1)[0, 1])


def evaluate(model: nn.Module, data: TensorDataset, batch_size: int = 512) -> dict[str, float]:
    """Log loss (mean cross-entropy), accuracy and count of ``model`` on ``data``, on the CPU.
    Blocking: call it in a worker thread.

    >>> evaluate(build_model(), split.val)  # doctest: +SKIP
    {'val_loss': 0.52, 'val_accuracy': 0.76, 'samples': 412.0}
    """
    total_loss, correct, count = 0.0, 0, 0
    with torch.inference_mode():
        for inputs, labels in DataLoader(data, batch_size=batch_size):
            logits = model(inputs).float()
            # one readback per batch of a held-out evaluation, off the event loop
            total_loss += float(F.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(dim=-1) == labels).sum())
            count += len(labels)
    if count == 0:
        return {"val_loss": math.nan, "val_accuracy": math.nan, "samples": 0.0}
    return {
        "val_loss": total_loss / count,
        "val_accuracy": correct / count,
        "samples": float(count),
    }


@dataclass(frozen=True)
class ServedModel:
    """One served version: the model (in eval mode, on the CPU), where it came from, and
    how it did on the held-out recipients when it was chosen."""

    version: int
    model: nn.Module
    run_id: str
    checkpoint: str
    metrics: dict[str, float]
    trained_on: dict[str, int] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """What ``GET /model`` shows."""
        return {
            "version": self.version,
            "run_id": self.run_id,
            "checkpoint": self.checkpoint,
            "metrics": self.metrics,
            "trained_on": self.trained_on,
        }


def load_served(checkpoint: str, seed: int = 0) -> nn.Module:
    """A CPU copy of the model in ``checkpoint`` (verified by :func:`core.load_weights`), in
    eval mode. Blocking: call it in a worker thread.

    >>> load_served(results.best_checkpoint)  # doctest: +SKIP
    """
    model = build_model(seed)
    load_weights(checkpoint, model)
    return model.eval()
