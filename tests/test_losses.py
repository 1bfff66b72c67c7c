"""core.losses: FocalLoss is cross-entropy at gamma=0 and down-weights easy examples above
it; Mixup blends inputs and targets with the same weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from core import ConfigError
from core.losses import FocalLoss, Mixup, MixupCollate


def logits_and_targets(n: int = 16, classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(n, classes, generator=generator) * 3
    return logits, torch.randint(0, classes, (n,), generator=generator)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_gamma_zero_is_cross_entropy(reduction: str, smoothing: float) -> None:
    logits, targets = logits_and_targets()
    targets[3] = -100  # ignored, as CrossEntropyLoss ignores it
    focal = FocalLoss(gamma=0.0, label_smoothing=smoothing, reduction=reduction)  # type: ignore[arg-type]
    expected = F.cross_entropy(logits, targets, label_smoothing=smoothing, reduction=reduction)
    torch.testing.assert_close(focal(logits, targets), expected)


def test_gamma_zero_matches_cross_entropy_on_sequences_probabilities_and_class_weights() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 3, 7, generator=generator)  # [N, C, L], as CrossEntropyLoss takes
    targets = torch.randint(0, 3, (4, 7), generator=generator)
    expected = F.cross_entropy(logits, targets)
    torch.testing.assert_close(FocalLoss(gamma=0.0)(logits, targets), expected)
    soft = torch.softmax(torch.randn(4, 3, 7, generator=generator), dim=1)
    torch.testing.assert_close(FocalLoss(gamma=0.0)(logits, soft), F.cross_entropy(logits, soft))
    weights = torch.tensor([1.0, 2.0, 0.5])
    torch.testing.assert_close(
        FocalLoss(gamma=0.0, alpha=weights.tolist(), reduction="none")(logits, targets),
        F.cross_entropy(logits, targets, weight=weights, reduction="none"),
    )


def test_gamma_down_weights_the_easy_examples() -> None:
    logits = torch.tensor([[6.0, 0.0, 0.0], [0.2, 0.0, 0.0]])  # confident and right; unsure
    targets = torch.tensor([0, 0])
    ce = F.cross_entropy(logits, targets, reduction="none")
    focal = FocalLoss(gamma=2.0, reduction="none")(logits, targets)
    ratio = focal / ce
    assert bool((focal < ce).all())
    assert ratio[0] < 1e-4 < 0.3 < ratio[1]  # (1 - p)**2: tiny for p ~ 1, large for p ~ 1/3


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ConfigError, match=r"gamma=-1\.0 is invalid"):
        FocalLoss(gamma=-1.0)
    with pytest.raises(ConfigError, match=r"label_smoothing=1\.0 is invalid; allowed: a float"):
        FocalLoss(label_smoothing=1.0)
    with pytest.raises(ConfigError, match="reduction='avg' is invalid"):
        FocalLoss(reduction="avg")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="alpha"):
        FocalLoss(alpha=[1.0, -2.0])
    with pytest.raises(ConfigError, match=r"alpha=0\.0 is invalid"):
        Mixup(alpha=0.0, num_classes=10)


def test_mixup_blends_inputs_and_targets_with_the_same_weight() -> None:
    torch.manual_seed(0)
    labels = torch.tensor([0, 1, 2, 3, 1, 2])
    inputs = F.one_hot(labels, 4).float()  # inputs equal to the targets: mixed alike
    mixed, soft = Mixup(alpha=0.4, num_classes=4)((inputs, labels))
    torch.testing.assert_close(mixed, soft)
    torch.testing.assert_close(soft.sum(dim=1), torch.ones(6))
    assert not torch.equal(soft, inputs)  # something was mixed


def test_mixup_collate_runs_in_a_loader_and_its_targets_train_with_focal_loss() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8, 3), torch.randint(0, 3, (8,)))
    loader = DataLoader(data, batch_size=4, collate_fn=MixupCollate(Mixup(0.2, num_classes=3)))
    inputs, soft = next(iter(loader))
    assert inputs.shape == (4, 3) and soft.shape == (4, 3) and soft.is_floating_point()
    loss = FocalLoss(gamma=2.0, label_smoothing=0.1)(torch.randn(4, 3, requires_grad=True), soft)
    assert loss.ndim == 0 and torch.isfinite(loss)
