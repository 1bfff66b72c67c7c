"""Training recipes that change the loss: :class:`FocalLoss` (multi-class focal loss with
label smoothing, on logits) and :class:`Mixup` (a batch transform whose soft targets every
loss here, and ``nn.CrossEntropyLoss``, accept).
"""

from __future__ import annotations

from core.losses.focal import FocalLoss, Reduction
from core.losses.mixup import Mixup, MixupCollate

__all__ = ("FocalLoss", "Mixup", "MixupCollate", "Reduction")
