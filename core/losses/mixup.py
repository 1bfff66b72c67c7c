"""Mixup (Zhang et al., 2018) as a batch transform: each batch is blended with a shuffled
copy of itself, and its targets become the blended class probabilities.

Losses that accept probabilities take the result as is (``nn.CrossEntropyLoss`` and
:class:`~core.losses.FocalLoss`); accuracy is not counted on soft targets, so training
accuracy is absent while validation (unmixed) keeps it. Put it where batches are made, so it
runs in the loader's workers::

    loader.collate_fn = MixupCollate(Mixup(alpha=0.2, num_classes=10), loader.collate_fn)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import default_collate

from core.checks import is_finite_number, is_int
from core.errors import config_error

__all__ = ("Mixup", "MixupCollate")


class Mixup:
    """``(inputs, targets) -> (lam * inputs + (1 - lam) * inputs[perm], soft targets)`` with
    ``lam ~ Beta(alpha, alpha)`` once per batch and ``perm`` a random permutation of it.

    ``targets`` are class indices ``[N]`` (made one-hot over ``num_classes``) or already
    probabilities ``[N, num_classes]``. Randomness comes from torch's global generator (in a
    loader worker: the worker's seeded one).

    >>> x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 1])
    >>> mixed, soft = Mixup(alpha=0.4, num_classes=3)((x, y))
    >>> soft.shape, bool(torch.allclose(soft.sum(1), torch.ones(4)))
    (torch.Size([4, 3]), True)
    """

    def __init__(self, alpha: float, num_classes: int) -> None:
        if not (is_finite_number(alpha) and alpha > 0):
            raise config_error("alpha", alpha, "a finite float > 0", "0.2 is a common value.")
        if not (is_int(num_classes) and num_classes >= 2):
            raise config_error("num_classes", num_classes, "an integer >= 2")
        self.alpha = float(alpha)
        self.num_classes = num_classes
        self._beta = torch.distributions.Beta(torch.tensor(self.alpha), torch.tensor(self.alpha))

    def __call__(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = batch
        if not (isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor)):
            raise TypeError(
                "Mixup needs (inputs, targets) tensor batches; got "
                f"({type(inputs).__name__}, {type(targets).__name__})."
            )
        if targets.is_floating_point():
            soft = targets
        else:
            soft = F.one_hot(targets.long(), self.num_classes).to(torch.float32)
        lam = float(self._beta.sample())  # a CPU tensor: no device sync
        perm = torch.randperm(inputs.shape[0])
        mixed = inputs.mul(lam).add_(inputs[perm], alpha=1.0 - lam)
        return mixed, soft.mul(lam).add_(soft[perm], alpha=1.0 - lam)


class MixupCollate:
    """A loader's ``collate_fn`` followed by :class:`Mixup` (picklable: it runs in workers)."""

    def __init__(self, mixup: Mixup, collate: Callable[[list[Any]], Any] | None = None) -> None:
        self.mixup = mixup
        self.collate = collate if collate is not None else default_collate

    def __call__(self, samples: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mixup(self.collate(samples))
