"""The batch-size search, run for real on CPU against memory budgets: the answer fits and
one more sample does not, in at most 12 trials, leaving weights, gradients and RNG as they
were; out-of-memory errors, dict batches, bounds and rank agreement."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch import nn

from core.errors import ConfigError, OutOfMemoryError
from core.memory import (
    MAX_TRIALS,
    GPUMemoryOptimizer,
    MemoryConfig,
    batch_maker_for_shape,
    batch_maker_from,
    find_batch_size,
    meter_for,
    optimize_batch_size,
    run_trial,
)

FEATURES = 64


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def peak_at(model: nn.Module, size: int, make: Any = None) -> int:
    make = make or batch_maker_for_shape((1, FEATURES))
    peak = run_trial(model, make, size, meter=meter_for("cpu")).peak_bytes
    assert peak is not None
    return peak


def fits(model: nn.Module, size: int, target: int, make: Any = None) -> bool:
    make = make or batch_maker_for_shape((1, FEATURES))
    return run_trial(model, make, size, meter=meter_for("cpu"), target_bytes=target).fits


@pytest.mark.parametrize("limit_samples", [300, 2500])
def test_the_answer_fits_and_one_more_sample_does_not(limit_samples: int) -> None:
    model = mlp()
    target = peak_at(model, limit_samples) + 1000  # a budget a little above that step's peak
    search = find_batch_size(model, (32, FEATURES), target / 2**30)
    assert len(search.trials) <= MAX_TRIALS
    assert fits(model, search.batch_size, search.target_bytes)
    assert not fits(model, search.batch_size + 1, search.target_bytes)
    assert search.batch_size in {t.batch_size for t in search.trials if t.fits}  # measured
    record = search.to_dict()
    assert record["batch_size"] == search.batch_size and len(record["trials"]) == len(search.trials)


def test_weights_gradients_and_rng_are_as_before_the_search() -> None:
    model = mlp()
    target = peak_at(model, 200)  # before the snapshot: a trial alone moves the weights
    model[0].weight.grad = torch.ones_like(model[0].weight)
    grad = model[0].weight.grad
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(7)
    random.seed(7)
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    find_batch_size(model, (32, FEATURES), target / 2**30)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in weights.items())
    assert model[0].weight.grad is grad and model[2].weight.grad is None
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == python_state


class OwnLoss(nn.Module):
    """A model that takes a dict batch and returns its own loss."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.cross_entropy(self.body(x), y)}


def test_a_dict_batch_model_is_searched_with_its_real_batch_tiled() -> None:
    model = OwnLoss()
    batch = {"x": torch.randn(5, FEATURES), "y": torch.randint(0, 3, (5,))}
    make = batch_maker_from(batch)
    assert make(12)["x"].shape == (12, FEATURES) and torch.equal(make(12)["y"][5:10], batch["y"])
    target = peak_at(model, 700, make) + 1000
    search = find_batch_size(model, None, target / 2**30, make_batch=make)
    assert len(search.trials) <= MAX_TRIALS and search.trials[0].batch_size == 1
    assert fits(model, search.batch_size, target, make)
    assert not fits(model, search.batch_size + 1, target, make)


def test_a_budget_too_small_for_one_sample_raises_a_clear_error() -> None:
    with pytest.raises(OutOfMemoryError, match=r"no batch size fits.*Tried: 32 .*1 \(peak"):
        find_batch_size(mlp(), (32, FEATURES), target_memory_gb=1e-4)


def test_max_batch_size_bounds_the_search() -> None:
    search = find_batch_size(mlp(), (32, FEATURES), target_memory_gb=64.0, max_batch_size=100)
    assert search.batch_size == 100 and max(t.batch_size for t in search.trials) == 100


class OutOfMemoryAbove(nn.Module):
    """Stands in for a CUDA device: raises torch's OOM error above ``limit`` samples."""

    def __init__(self, limit: int, error: type[Exception] = torch.OutOfMemoryError) -> None:
        super().__init__()
        self.limit, self.error = limit, error
        self.linear = nn.Linear(FEATURES, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise self.error("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.linear(x)


@pytest.mark.parametrize("limit", [1, 37, 100])
def test_an_injected_out_of_memory_error_finds_exactly_that_boundary(limit: int) -> None:
    search = find_batch_size(OutOfMemoryAbove(limit), (32, FEATURES), target_memory_gb=64.0)
    assert search.batch_size == limit and len(search.trials) <= MAX_TRIALS
    failed = [t for t in search.trials if not t.fits]
    assert failed and all(t.peak_bytes is None and "out of memory" in t.reason for t in failed)


def test_other_errors_propagate_and_the_weights_are_restored() -> None:
    model = OutOfMemoryAbove(40, error=ValueError)
    weights = model.linear.weight.clone()
    with pytest.raises(ValueError, match="CUDA out of memory"):
        find_batch_size(model, (32, FEATURES), target_memory_gb=64.0)
    assert torch.equal(model.linear.weight, weights)


def test_ranks_agree_through_the_agree_function() -> None:
    seen: list[int] = []

    def agree(batch_size: int) -> int:  # stands in for the all_reduce(MIN) across ranks
        seen.append(batch_size)
        return batch_size - 3

    search = find_batch_size(OutOfMemoryAbove(37), (32, FEATURES), 64.0, agree=agree)
    assert seen == [37] and search.batch_size == 34


def test_token_inputs_need_a_vocabulary_size() -> None:
    model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(8 * 6, 2))
    make = batch_maker_for_shape((4, 6), input_dtype=torch.long, vocab_size=50)
    assert make(3).dtype == torch.long and int(make(3).max()) < 50
    assert optimize_batch_size(model, (4, 6), 64.0, max_batch_size=64, make_batch=make) == 64
    with pytest.raises(ConfigError, match="vocab_size=None is invalid"):
        batch_maker_for_shape((4, 6), input_dtype=torch.long)


def test_the_default_target_is_the_free_host_memory() -> None:
    search = find_batch_size(mlp(), (8, FEATURES), max_batch_size=16)
    assert search.batch_size == 16
    assert search.target_bytes == pytest.approx(meter_for("cpu").budget_default(0.1), rel=0.05)


def test_the_class_api_keeps_the_last_search_and_validates_overrides() -> None:
    finder = GPUMemoryOptimizer(MemoryConfig(target_memory_gb=64.0, max_batch_size=48))
    assert finder.optimize_batch_size(mlp(), (32, FEATURES)) == 48
    assert finder.last_search is not None and finder.last_search.batch_size == 48
    assert finder.optimize_batch_size(mlp(), (32, FEATURES), max_batch_size=40) == 40
    with pytest.raises(ConfigError, match=r"margin=1\.0 is invalid"):
        finder.optimize_batch_size(mlp(), (32, FEATURES), margin=1.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("target_memory_gb", 0.0),
        ("target_memory_gb", float("nan")),
        ("max_batch_size", 0),
        ("max_batch_size", True),
        ("margin", -0.1),
        ("auto_batch_size", "yes"),
    ],
)
def test_memory_config_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"^{field}="):
        MemoryConfig(**{field: value})  # type: ignore[arg-type]


def test_a_bad_input_shape_is_named() -> None:
    with pytest.raises(ConfigError, match=r"input_shape=\(0, 4\) is invalid"):
        find_batch_size(mlp(), (0, 4), 1.0)
