"""seed_everything: every generator reproduces; deterministic mode switches torch's flag.
And the initial-weights hash that tells whether two runs started from the same weights."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from core.loop.seeding import seed_everything as reexported
from core.rng import seed_everything
from core.telemetry.init_hash import HASH_METHOD, previous_init_hash, weights_hash
from tests.helpers import make_model


def draws() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.randn(3)


def test_models_built_after_the_same_seed_are_identical() -> None:
    seed_everything(0)
    first = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    seed_everything(0)
    second = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    seed_everything(1)
    third = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    pairs = zip(first.parameters(), second.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert not torch.equal(first[0].weight, third[0].weight)


def test_python_numpy_and_torch_reproduce() -> None:
    seed_everything(123)
    a = draws()
    seed_everything(123)
    b = draws()
    assert a[:2] == b[:2] and torch.equal(a[2], b[2])
    seed_everything(2**40)  # beyond NumPy's 32-bit seeds: reduced, not refused
    assert draws()[0] != a[0]


def test_the_old_import_path_is_the_same_function() -> None:
    assert reexported is seed_everything


@pytest.fixture
def restore_determinism() -> Iterator[None]:
    algorithms = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    yield
    torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def test_deterministic_switches_torch_and_cudnn(
    restore_determinism: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    seed_everything(0)
    assert not torch.are_deterministic_algorithms_enabled()
    seed_everything(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own choice stays
    seed_everything(0, deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    make_model()(torch.randn(2, 8)).sum().backward()  # ordinary training still runs


@pytest.mark.parametrize("bad", [-1, True, 1.5, "0", None])
def test_a_bad_seed_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"^seed=.* is invalid; allowed: an integer >= 0"):
        seed_everything(bad)  # type: ignore[arg-type]


def test_a_bad_deterministic_flag_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^deterministic='yes' is invalid"):
        seed_everything(0, deterministic="yes")  # type: ignore[arg-type]


# -- the initial-weights hash (core.telemetry.init_hash) --------------------------------


def test_the_weights_hash_follows_names_dtypes_shapes_and_bits() -> None:
    seed_everything(0)
    model = make_model()
    digest = weights_hash(model)
    assert len(digest) == 64 and digest == weights_hash(make_model())  # make_model seeds 0
    assert weights_hash(make_model(seed=1)) != digest
    bf16 = make_model().to(torch.bfloat16)
    assert weights_hash(bf16) != digest
    renamed = torch.nn.Sequential()
    for name, module in zip(("a", "b", "c"), make_model(), strict=True):
        renamed.add_module(name, module)
    assert weights_hash(renamed) != digest
    with torch.no_grad():
        model[0].weight[0, 0] = torch.nextafter(model[0].weight[0, 0], torch.tensor(1.0))
    assert weights_hash(model) != digest  # one ulp in a sampled weight (the first)
    buffered = torch.nn.BatchNorm1d(4)
    before = weights_hash(buffered)
    buffered.running_mean += 1  # buffers count
    assert weights_hash(buffered) != before


def test_the_fingerprint_samples_values_and_never_copies_the_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    big = torch.nn.Linear(1000, 1000)  # 1M values in the weight: 64 of them are read
    digest = weights_hash(big)
    with torch.no_grad():
        big.weight[0, 0] += 1.0  # the first value is always sampled
    assert weights_hash(big) != digest
    restored = weights_hash(big)
    with torch.no_grad():
        big.weight[0, 7] += 1.0  # between two sampled values: by design, not seen
    assert weights_hash(big) == restored
    copied: list[int] = []
    real_cpu = torch.Tensor.cpu

    def counting_cpu(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        copied.append(self.numel())
        return real_cpu(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    weights_hash(big)
    assert copied == [(64 + 64) * 4]  # one host copy: 64 float32 values of weight and of bias
    assert "64 evenly spaced values" in HASH_METHOD


def write_run(experiment: Path, run_id: str, first: dict[str, object] | None) -> None:
    run_dir = experiment / run_id
    run_dir.mkdir(parents=True)
    lines = [] if first is None else [json.dumps({"event": "run_start", **first})]
    lines.append(json.dumps({"event": "train_step", "model_init_hash": "not-this-one"}))
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")


def test_the_previous_hash_is_the_newest_other_run_that_recorded_one(tmp_path: Path) -> None:
    experiment = tmp_path / "experiment"
    assert previous_init_hash(experiment, "20261122-120000.000-aaaaaa") is None  # no directory
    method = {"model_init_hash_method": HASH_METHOD}
    write_run(experiment, "20261122-100000.000-aaaaaa", {"model_init_hash": "oldest", **method})
    write_run(experiment, "20261122-110000.000-bbbbbb", {"model_init_hash": "older", **method})
    write_run(experiment, "20261122-113000.000-cccccc", {"config": {}})  # before the field
    write_run(experiment, "20261122-113500.000-cccccd", {"model_init_hash": "full"})  # other way
    write_run(experiment, "20261122-114000.000-dddddd", None)  # no run_start line
    (experiment / "20261122-115000.000-eeeeee").mkdir()  # no events.jsonl at all
    (experiment / "checkpoints").mkdir()
    write_run(experiment, "20261122-120000.000-ffffff", {"model_init_hash": "current", **method})
    assert previous_init_hash(experiment, "20261122-120000.000-ffffff") == "older"
    assert previous_init_hash(experiment, "20261122-110000.000-bbbbbb") == "current"
    assert previous_init_hash(experiment / "20261122-100000.000-aaaaaa", "x") is None
