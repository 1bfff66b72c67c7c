"""Synthetic email-campaign sequence classification example."""

from __future__ import annotations

from .data import EmailSequenceDataset, majority_class_rate
from .model import EmailSequenceModel

__all__ = ["EmailSequenceDataset", "EmailSequenceModel", "majority_class_rate"]
