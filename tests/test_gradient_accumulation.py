from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from core import (
    ConfigError,
    GradientAccumulation,
    GradientAccumulationConfig,
    create_optimized_training_optimizer,
)
from tests.helpers import make_classification, make_model


def batches(sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(n, 3), torch.zeros(n, dtype=torch.long)) for n in sizes]


def test_windows_group_batches_and_keep_the_short_tail() -> None:
    acc = GradientAccumulation(GradientAccumulationConfig(accumulation_steps=3))
    windows = list(acc.windows(batches([4, 4, 4, 4, 2])))
    assert [w.sizes for w in windows] == [[4, 4, 4], [4, 2]]
    assert [w.samples for w in windows] == [12, 6]
    assert [w.first_batch_index for w in windows] == [0, 3]


def test_micro_batches_split_by_size_and_only_the_last_syncs() -> None:
    acc = GradientAccumulation(GradientAccumulationConfig(accumulation_steps=2, micro_batch_size=3))
    (window,) = list(acc.windows(batches([7, 2])))
    micro = acc.micro_batches(window)
    assert [m.samples for m in micro] == [3, 2, 2, 2]
    assert [m.is_last for m in micro] == [False, False, False, True]
    assert sum(m.samples for m in micro) == window.samples


def test_halving_the_micro_batch() -> None:
    acc = GradientAccumulation()
    assert acc.halve_micro_batch(largest_batch=8) == 4
    assert acc.halve_micro_batch(largest_batch=8) == 2
    assert acc.halve_micro_batch(largest_batch=8) == 1
    assert acc.halve_micro_batch(largest_batch=8) is None


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"accumulation_steps": 0}, r"accumulation_steps=0 is invalid; allowed: an integer >= 1"),
        ({"accumulation_steps": 2.5}, r"accumulation_steps=2.5 is invalid"),
        ({"micro_batch_size": 0}, r"micro_batch_size=0 is invalid"),
    ],
)
def test_config_errors(kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        GradientAccumulationConfig(**kwargs)  # type: ignore[arg-type]


def reference_big_batch_sgd(
    model: nn.Module, data: torch.utils.data.TensorDataset, window_sizes: list[int], lr: float
) -> None:
    """One SGD step per window on one batch holding all of the window's samples."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    start = 0
    for size in window_sizes:
        x, y = data[start : start + size]
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        start += size


@pytest.mark.parametrize("micro_batch_size", [None, 5])
def test_accumulated_gradient_equals_the_big_batch_gradient(
    micro_batch_size: int | None, log_dir: Path
) -> None:
    # 88 samples in batches of 16 -> 16,16,16,16,16,8; windows of 4 -> 64 and a short 24.
    data = make_classification(88)
    ours, reference = make_model(seed=3), make_model(seed=3)
    optimizer = create_optimized_training_optimizer(
        model=ours,
        train_loader=DataLoader(data, batch_size=16),
        gradient_accumulation_config=GradientAccumulationConfig(4, micro_batch_size),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5),
        max_epochs=1,
        log_dir=log_dir,
    )
    results = anyio.run(optimizer.train)
    assert results.global_step == 2
    reference_big_batch_sgd(reference, data, [64, 24], lr=0.5)
    for a, b in zip(ours.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_dividing_by_accumulation_steps_would_differ(log_dir: Path) -> None:
    """Guards the test above: the naive normalisation gives measurably different weights."""
    data = make_classification(88)
    naive, reference = make_model(seed=3), make_model(seed=3)
    optimizer = torch.optim.SGD(naive.parameters(), lr=0.5)
    for start, stop in ((0, 64), (64, 88)):
        for i in range(start, stop, 16):
            x, y = data[i : min(i + 16, stop)]
            (nn.functional.cross_entropy(naive(x), y) / 4).backward()
        optimizer.step()
        optimizer.zero_grad()
    reference_big_batch_sgd(reference, data, [64, 24], lr=0.5)
    assert not all(
        torch.allclose(a, b, atol=1e-6)
        for a, b in zip(naive.parameters(), reference.parameters(), strict=True)
    )
