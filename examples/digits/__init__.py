"""Seed 003's example data: scikit-learn's handwritten digits (8x8 images, 10 classes,
bundled with scikit-learn, no download) and a small CNN, as ``core-train`` factories::

    core-train --example digits --epochs 8 --scheduler onecycle
"""

from __future__ import annotations

from .data import IMAGE_SHAPE, NUM_CLASSES, build_data, digits_datasets
from .model import DigitsCNN, DigitsMLP, build_model

__all__ = [
    "IMAGE_SHAPE",
    "NUM_CLASSES",
    "DigitsCNN",
    "DigitsMLP",
    "build_data",
    "build_model",
    "digits_datasets",
]
