"""The model before it is wrapped, in real runs (core.trainer.assembly.model_setup): the batch-size
search chooses the micro-batch and keeps the result, activation checkpointing and
channels_last are applied and recorded, and the flat keywords reach the tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from core import ConfigError, TrainingConfig, create_optimized_training_optimizer
from core.trainer.assembly.model_setup import optimizer_factory_like
from tests.helpers import make_classification


class Blocks(nn.Module):
    """Four repeated residual blocks (activation checkpointing finds them)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(8, 64)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64), nn.GELU()) for _ in range(4)
        )
        self.out = nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        out: torch.Tensor = self.out(h)
        return out


def train(log_dir: Path, model: nn.Module, loader: Any, **settings: Any) -> tuple[Any, Any]:
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=loader,
        max_epochs=1,
        log_dir=log_dir,
        seed=0,
        learning_rate=1e-2,
        **settings,
    )
    results = anyio.run(optimizer.train)
    return optimizer, results


def run_start(results: Any) -> dict[str, Any]:
    lines = (results.run_dir / "events.jsonl").read_text().splitlines()
    return next(r for r in map(json.loads, lines) if r["event"] == "run_start")


def test_auto_batch_size_splits_a_loader_batch_that_does_not_fit(log_dir: Path) -> None:
    loader = DataLoader(make_classification(256), batch_size=128)
    _, probe = train(log_dir, Blocks(), loader, auto_batch_size=True, target_memory_gb=1.0)
    search = run_start(probe)["resolved"]["model_setup"]["batch_size_search"]
    fits_all = search["batch_size"]
    assert fits_all >= 128 and all(t["fits"] for t in search["trials"] if t["batch_size"] <= 128)
    # A budget between the peaks of 32 and 128 samples: the search must split.
    peaks = {t["batch_size"]: t["peak_bytes"] for t in search["trials"] if t["peak_bytes"]}
    small = max(b for b in peaks if b < 128)
    budget = (peaks[small] + peaks[min(b for b in peaks if b > small)]) / 2 / 2**30
    searched, results = train(
        log_dir, Blocks(), loader, auto_batch_size=True, target_memory_gb=budget
    )
    resolved = run_start(results)["resolved"]["model_setup"]
    chosen = resolved["batch_size_search"]["batch_size"]
    assert small <= chosen < 128
    assert (
        resolved["micro_batch_size"]
        == chosen
        == searched.describe()["gradient_accumulation"]["micro_batch_size"]
    )
    assert len(resolved["batch_size_search"]["trials"]) <= 12
    # The effective batch is unchanged: the same weights as a run told that micro-batch.
    told, _ = train(log_dir, Blocks(), loader, micro_batch_size=chosen)
    for a, b in zip(searched.model.parameters(), told.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_the_search_leaves_the_shuffle_and_the_weights_alone(log_dir: Path) -> None:
    def loader() -> DataLoader[Any]:
        return DataLoader(make_classification(128), batch_size=32, shuffle=True)

    searched, _ = train(log_dir, Blocks(), loader(), auto_batch_size=True, target_memory_gb=4.0)
    plain, _ = train(log_dir, Blocks(), loader())
    for a, b in zip(searched.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_activation_checkpointing_in_a_run_is_recorded_and_changes_nothing(
    log_dir: Path,
) -> None:
    loader = DataLoader(make_classification(128), batch_size=32)
    checked, results = train(log_dir, Blocks(), loader, activation_checkpointing=True)
    resolved = run_start(results)["resolved"]["model_setup"]
    assert resolved["activation_checkpointed"] == [f"blocks.{i}" for i in range(4)]
    assert resolved["compiled"] == [] and resolved["channels_last"] is False  # CPU: auto off
    plain, _ = train(log_dir, Blocks(), loader)
    for a, b in zip(checked.model.parameters(), plain.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


class ConvNet(nn.Module):
    """A conv net that records whether its training inputs arrived channels_last."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 2)
        self.formats: set[bool] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.formats.add(x.is_contiguous(memory_format=torch.channels_last))
        out: torch.Tensor = self.head(self.conv(x).mean(dim=(2, 3)))
        return out


def test_channels_last_converts_the_model_and_every_batch(log_dir: Path) -> None:
    g = torch.Generator().manual_seed(0)
    images = TensorDataset(torch.randn(32, 3, 8, 8, generator=g), torch.randint(0, 2, (32,)))
    loader = DataLoader(images, batch_size=8)
    model = ConvNet()
    train(log_dir, model, loader, channels_last=True, val_loader=loader)
    assert model.formats == {True}
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_the_new_sections_are_reached_by_flat_keywords_and_dotted_paths() -> None:
    tree = TrainingConfig().replace(
        {"data.loader.device_prefetch": False, "transforms.compile_mode": "max-autotune"}
    )
    assert tree.data.loader.device_prefetch is False
    back = TrainingConfig.from_dict(tree.to_dict())
    assert (back.data, back.transforms, back.memory) == (tree.data, tree.transforms, tree.memory)
    checkpointed = TrainingConfig().replace({"transforms.activation_checkpointing": ["Block"]})
    assert TrainingConfig.from_dict(checkpointed.to_dict()).transforms == checkpointed.transforms
    with pytest.raises(ConfigError, match=r"compile_mode='fast' is invalid"):
        create_optimized_training_optimizer(
            model=Blocks(),
            train_loader=[],
            compile_mode="fast",  # type: ignore[arg-type]
        )
    with pytest.raises(ConfigError, match=r"data.loader.num_workers=-3 is invalid"):
        TrainingConfig().replace({"data.loader.num_workers": -3})


class Stream:
    """A re-iterable loader without ``len()``."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        return iter(self.loader)


def test_device_prefetch_wraps_sized_loaders_and_leaves_streams(log_dir: Path) -> None:
    def loader() -> DataLoader[Any]:
        return DataLoader(make_classification(128), batch_size=32, shuffle=True)

    wrapped, _ = train(log_dir, Blocks(), loader(), device_prefetch=True)
    assert type(wrapped._built.train_loader).__name__ == "DevicePrefetcher"
    plain, _ = train(log_dir, Blocks(), loader(), device_prefetch=False)
    for a, b in zip(wrapped.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(a, b)
    stream, results = train(log_dir, Blocks(), Stream(loader()), device_prefetch=True)
    assert isinstance(stream._built.train_loader, Stream) and results.global_step == 4


def test_the_trials_build_fresh_optimizers_like_a_given_adamw() -> None:
    model = nn.Linear(4, 2)
    given = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.5, betas=(0.8, 0.9))
    factory = optimizer_factory_like(given)  # its defaults hold a key AdamW does not take
    assert factory is not None
    fresh = factory(list(nn.Linear(4, 2).parameters()))
    assert type(fresh) is torch.optim.AdamW
    assert (fresh.defaults["lr"], fresh.defaults["weight_decay"]) == (0.01, 0.5)
    assert fresh.defaults["betas"] == (0.8, 0.9)
