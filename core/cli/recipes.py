"""The training recipes ``fit`` builds around the model: the loss (cross-entropy with label
smoothing, or focal loss), the learning-rate schedule over the run's optimizer steps, and
batch transforms installed in the training loader (Mixup; RandAugment with torchvision)."""

from __future__ import annotations

import argparse
import importlib
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LRScheduler, OneCycleLR
from torch.utils.data import DataLoader, default_collate

from core.cli.parser import choice
from core.config import TrainingConfig
from core.loop.limit import Limit, epoch_batches
from core.losses import FocalLoss, Mixup, MixupCollate

__all__ = (
    "RandAugmentCollate",
    "add_recipe_flags",
    "install_batch_transforms",
    "loss_function",
    "scheduler_factory",
    "steps_per_epoch",
    "total_steps",
)


def loss_function(*, focal: bool, label_smoothing: float, soft_targets: bool) -> nn.Module | None:
    """The loss for the flags (None: the run's default, plain cross-entropy). Soft targets
    (Mixup) need an explicit loss: the default refuses float targets."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"--label-smoothing {label_smoothing!r}: allowed: a float in [0, 1)")
    if focal:
        return FocalLoss(gamma=2.0, label_smoothing=label_smoothing)
    if label_smoothing or soft_targets:
        return nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    return None


def steps_per_epoch(
    loader: Iterable[Any], accumulation_steps: int, world_size: int, limit: Limit = None
) -> int | None:
    """Optimizer steps in one epoch of ``loader`` on one rank (a short last window is a
    step), its batches capped by ``limit`` (``run.limit_train_batches``); a DataLoader is
    counted as the run re-shards it over ``world_size`` ranks. None when the loader has no
    length and no integer limit."""
    batches = epoch_batches(limit, _batches_per_rank(loader, world_size), "limit_train_batches")
    return None if batches is None else math.ceil(batches / accumulation_steps)


def _batches_per_rank(loader: Iterable[Any], world_size: int) -> int | None:
    try:
        batches = len(loader)  # type: ignore[arg-type]
    except TypeError:
        return None
    if world_size > 1 and isinstance(loader, DataLoader) and loader.batch_size:
        per_rank = math.ceil(len(loader.dataset) / world_size)  # type: ignore[arg-type]
        size = loader.batch_size
        batches = per_rank // size if loader.drop_last else math.ceil(per_rank / size)
    return batches


def total_steps(config: TrainingConfig, per_epoch: int | None) -> int | None:
    """The run's optimizer steps: ``max_epochs`` epochs, capped by ``max_steps``."""
    steps = None if per_epoch is None else per_epoch * config.run.max_epochs
    cap = config.run.max_steps
    return cap if steps is None else (steps if cap is None else min(steps, cap))


def scheduler_factory(
    kind: str, config: TrainingConfig, train_loader: Iterable[Any], world_size: int
) -> Callable[[torch.optim.Optimizer], LRScheduler] | None:
    """``onecycle``: ``OneCycleLR(max_lr=learning_rate, total_steps=the run's steps)``;
    ``cosine``: ``CosineAnnealingLR(T_max=the run's steps)``; ``none``: None."""
    if kind == "none":
        return None
    config = config.for_run()  # a fast_dev_run's one short epoch
    per_epoch = steps_per_epoch(
        train_loader,
        config.accumulation.accumulation_steps,
        world_size,
        config.run.limit_train_batches,
    )
    steps = total_steps(config, per_epoch)
    if steps is None:
        raise ValueError(
            f"--scheduler {kind!r}: the training loader has no length, so the run's steps are "
            "unknown; allowed: a loader with len(), or --max-steps N. Fix: give --max-steps."
        )
    if kind == "onecycle":
        lr = config.optim.learning_rate
        return lambda optimizer: OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
    return lambda optimizer: CosineAnnealingLR(optimizer, T_max=steps)


class RandAugmentCollate:
    """A loader's ``collate_fn`` followed by torchvision's ``RandAugment`` on each image of
    an ``(images [N, C, H, W], labels)`` batch (picklable: it runs in workers)."""

    def __init__(self, augment: Any, collate: Callable[[list[Any]], Any] | None = None) -> None:
        self.augment = augment
        self.collate = collate if collate is not None else default_collate

    def __call__(self, samples: list[Any]) -> tuple[torch.Tensor, Any]:
        images, labels = self.collate(samples)
        if not (isinstance(images, torch.Tensor) and images.ndim == 4):
            raise ValueError(
                "--randaugment needs image batches [N, C, H, W]; got "
                f"{getattr(images, 'shape', type(images).__name__)}. Fix: leave it out for "
                "non-image data."
            )
        return torch.stack([self.augment(image) for image in images]), labels


def _num_classes(model: nn.Module) -> int:
    last = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not last:
        raise ValueError(
            "--mixup needs the number of classes, read from the model's last nn.Linear, and "
            "this model has none. Fix: leave --mixup out, or end the model with nn.Linear."
        )
    return last[-1].out_features


def install_batch_transforms(
    loader: Iterable[Any], model: nn.Module, *, mixup: float | None, randaugment: bool
) -> None:
    """Put RandAugment, then Mixup, into the training loader's ``collate_fn``."""
    if mixup is None and not randaugment:
        return
    if not isinstance(loader, DataLoader):
        raise ValueError(
            f"--mixup/--randaugment need a torch DataLoader; the data factory returned a "
            f"{type(loader).__name__}. Fix: return a DataLoader, or leave them out."
        )
    if randaugment:
        try:
            v2 = importlib.import_module("torchvision.transforms.v2")
        except ImportError:
            raise ValueError(
                "--randaugment needs torchvision, which is not installed. Fix: pip install "
                "torchvision, or leave --randaugment out."
            ) from None
        loader.collate_fn = RandAugmentCollate(v2.RandAugment(), loader.collate_fn)
    if mixup is not None:
        loader.collate_fn = MixupCollate(Mixup(mixup, _num_classes(model)), loader.collate_fn)


def _number(text: str, allowed: str, check: Callable[[float], bool]) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and check(value)):
        raise argparse.ArgumentTypeError(f"{text!r}: invalid value; allowed: {allowed}")
    return value


def _fraction(text: str) -> float:
    return _number(text, "a float in [0, 1), e.g. 0.1", lambda x: 0.0 <= x < 1.0)


def _positive(text: str) -> float:
    return _number(text, "a float > 0, e.g. 0.2", lambda x: x > 0.0)


def add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    """What ``fit`` builds around the model: batch size, loss, scheduler, transforms."""
    group = parser.add_argument_group("recipes (built by fit, outside the config tree)")
    group.add_argument(
        "--batch-size",
        type=int,
        default=64,
        metavar="N",
        help="the batch size the data factory's loaders use (not a micro-batch: "
        "see --micro-batch-size) (default: 64)",
    )
    group.add_argument(
        "--label-smoothing",
        type=_fraction,
        default=0.0,
        metavar="X",
        help="CrossEntropyLoss(label_smoothing=X), or FocalLoss's (default: 0)",
    )
    group.add_argument(
        "--focal-loss",
        action="store_true",
        help="core.losses.FocalLoss(gamma=2.0) instead of cross-entropy",
    )
    group.add_argument(
        "--scheduler",
        type=choice("onecycle", "cosine", "none"),
        default="none",
        metavar="{onecycle,cosine,none}",
        help="onecycle: OneCycleLR(max_lr=--lr) over the run's optimizer steps; "
        "cosine: CosineAnnealingLR over them; none (default)",
    )
    group.add_argument(
        "--mixup",
        type=_positive,
        default=None,
        metavar="ALPHA",
        help="Mixup of (images, labels) batches with Beta(ALPHA, ALPHA) "
        "weights; the targets become class probabilities",
    )
    group.add_argument(
        "--randaugment",
        action="store_true",
        help="torchvision's RandAugment on image batches (needs torchvision)",
    )
