from __future__ import annotations

from functools import partial
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
from core.distributed import Strategy
from core.loop.recovery import ErrorHandler
from tests.helpers import TokenModel, make_classification, make_model, padded_sequences

CHECK = partial(ErrorHandler().check_batch, epoch=0)


def batches(sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(n, 3), torch.zeros(n, dtype=torch.long)) for n in sizes]


def test_windows_group_batches_and_keep_the_short_tail() -> None:
    acc = GradientAccumulation(GradientAccumulationConfig(accumulation_steps=3))
    windows = list(acc.windows(batches([4, 4, 4, 4, 2]), CHECK))
    assert [w.sizes for w in windows] == [[4, 4, 4], [4, 2]]
    assert [w.samples for w in windows] == [12, 6]
    assert [w.first_batch_index for w in windows] == [0, 3]


def test_micro_batches_split_by_size_and_only_the_last_syncs() -> None:
    acc = GradientAccumulation(GradientAccumulationConfig(accumulation_steps=2, micro_batch_size=3))
    (window,) = list(acc.windows(batches([7, 2]), CHECK))
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
        (
            {"normalize_by": "words"},
            r"normalize_by='words' is invalid; allowed: 'samples', 'tokens'",
        ),
        ({"ignore_index": None}, r"ignore_index=None is invalid; allowed: an integer"),
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


def token_run(normalize_by: str, log_dir: Path, micro_batch_size: int | None = None) -> nn.Module:
    """One optimizer step (SGD, lr 1) over a window of two padded batches of two sequences."""
    model = TokenModel()
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(padded_sequences(4), batch_size=2),
        loss_fn=nn.CrossEntropyLoss(),  # ignore_index -100: a mean over real tokens
        gradient_accumulation_config=GradientAccumulationConfig(
            2,
            micro_batch_size,
            normalize_by=normalize_by,  # type: ignore[arg-type]
        ),
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        max_epochs=1,
        log_dir=log_dir,
    )
    assert anyio.run(optimizer.train).global_step == 1
    return model


def big_batch_step() -> nn.Module:
    model = TokenModel()
    tokens, targets = padded_sequences(4)[:]
    nn.functional.cross_entropy(model(tokens), targets).backward()
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    return model


@pytest.mark.parametrize("micro_batch_size", [None, 1])
def test_token_normalised_accumulation_equals_the_big_batch_with_padding(
    micro_batch_size: int | None, log_dir: Path
) -> None:
    # Real tokens per sequence: 1, 6, 5, 4, so the two batches hold 7 and 9 tokens.
    ours = token_run("tokens", log_dir, micro_batch_size)
    reference = big_batch_step()
    for a, b in zip(ours.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_sample_normalisation_is_off_on_padded_batches(log_dir: Path) -> None:
    """Guards the test above: weighting by samples gives a visibly different update."""
    start = TokenModel()
    by_samples, reference = token_run("samples", log_dir), big_batch_step()
    moved = [b - s for b, s in zip(reference.parameters(), start.parameters(), strict=True)]
    wrong = [a - b for a, b in zip(by_samples.parameters(), reference.parameters(), strict=True)]
    relative = (
        torch.cat([w.flatten() for w in wrong]).norm()
        / torch.cat([m.flatten() for m in moved]).norm()
    )
    assert relative > 0.05


def test_tokens_need_targets(log_dir: Path) -> None:
    acc = GradientAccumulation(GradientAccumulationConfig(normalize_by="tokens"))
    (window,) = list(acc.windows([{"input_ids": torch.ones(2, 3, dtype=torch.long)}], CHECK))
    with pytest.raises(Exception, match=r"normalize_by='tokens' needs target tokens"):
        acc.loss_weights(acc.micro_batches(window), window, Strategy(torch.device("cpu")))
