"""Multi-class focal loss on logits (Lin et al., 2017), with label smoothing and soft targets.

``FocalLoss(gamma=0.0)`` is ``nn.CrossEntropyLoss`` (same label smoothing, same
``ignore_index``); ``gamma > 0`` scales each class term by ``(1 - p)**gamma``, so examples
the model already gets right with confidence add little and hard ones dominate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from core.checks import is_finite_number, is_int
from core.errors import config_error

__all__ = ("FocalLoss", "Reduction")

Reduction = Literal["mean", "sum", "none"]


class FocalLoss(nn.Module):
    """``-sum_c alpha_c (1 - p_c)**gamma q_c log p_c`` per element, where ``p = softmax``
    over dimension 1 of the logits and ``q`` the target distribution: the one-hot class
    (integer targets) or the given probabilities (float targets of the logits' shape, as
    :class:`~core.losses.Mixup` makes), smoothed as ``(1 - label_smoothing) q +
    label_smoothing / C``.

    ``alpha``: a weight per class (a sequence of ``C`` floats) or one float for every class
    (None: 1). ``reduction="mean"`` averages over the elements whose target is not
    ``ignore_index`` (a plain mean: unlike ``CrossEntropyLoss(weight=...)``, not divided by
    the summed weights; 0 when every target is ignored). Computed in float32 under autocast,
    with no host sync.

    >>> logits, targets = torch.randn(8, 5), torch.randint(0, 5, (8,))
    >>> torch.allclose(FocalLoss(gamma=0.0)(logits, targets), F.cross_entropy(logits, targets))
    True
    """

    alpha: torch.Tensor | None

    def __init__(
        self,
        gamma: float = 2.0,
        alpha: float | Sequence[float] | None = None,
        label_smoothing: float = 0.0,
        reduction: Reduction = "mean",
        ignore_index: int = -100,
    ) -> None:
        super().__init__()
        if not (is_finite_number(gamma) and gamma >= 0):
            raise config_error("gamma", gamma, "a finite float >= 0", "2.0 is the usual value.")
        if not (is_finite_number(label_smoothing) and 0 <= label_smoothing < 1):
            raise config_error("label_smoothing", label_smoothing, "a float in [0, 1)", "try 0.1.")
        if reduction not in get_args(Reduction):
            raise config_error("reduction", reduction, get_args(Reduction))
        if not is_int(ignore_index):
            raise config_error("ignore_index", ignore_index, "an integer (usually -100)")
        self.gamma = float(gamma)
        self.label_smoothing = float(label_smoothing)
        self.reduction: Reduction = reduction
        self.ignore_index = ignore_index
        self.register_buffer("alpha", _alpha_tensor(alpha), persistent=False)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        log_p = F.log_softmax(logits.float(), dim=1)
        classes = log_p.shape[1]
        valid: torch.Tensor | None = None
        if target.is_floating_point():
            if target.shape != logits.shape:
                raise ValueError(
                    f"FocalLoss: probability targets of shape {tuple(target.shape)} do not "
                    f"match the logits {tuple(logits.shape)}; pass class indices or one "
                    "probability per class."
                )
            q = target.float()
        else:
            valid = target != self.ignore_index
            q = F.one_hot(torch.where(valid, target, 0), classes).movedim(-1, 1).float()
        if self.label_smoothing:
            q = q * (1.0 - self.label_smoothing) + self.label_smoothing / classes
        terms = -q * log_p
        if self.gamma:
            terms = terms * (1.0 - log_p.exp()).clamp_min(0.0).pow(self.gamma)
        if self.alpha is not None:
            alpha = self.alpha.to(terms.device)
            terms = terms * alpha.view(1, -1, *([1] * (terms.ndim - 2))).expand_as(terms)
        loss = terms.sum(dim=1)
        if valid is not None:
            loss = loss * valid
        if self.reduction == "none":
            return loss
        if self.reduction == "sum":
            return loss.sum()
        if valid is None:
            return loss.mean()
        return loss.sum() / valid.sum().clamp_min(1)


def _alpha_tensor(alpha: float | Sequence[float] | None) -> torch.Tensor | None:
    if alpha is None:
        return None
    if is_finite_number(alpha) and alpha > 0:
        return torch.tensor([float(alpha)])
    values = list(alpha) if isinstance(alpha, Sequence) else None
    if not values or not all(is_finite_number(v) and v >= 0 for v in values):
        raise config_error(
            "alpha", alpha, "None, a float > 0, or a sequence of C floats >= 0 (one per class)"
        )
    return torch.tensor([float(v) for v in values])
