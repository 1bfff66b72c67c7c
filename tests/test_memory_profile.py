"""The memory profile's breakdown (parameters, gradients, optimizer state, activations) and
``optimize_model_memory`` / ``GPUMemoryOptimizer`` measuring a step before and after."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.errors import ConfigError
from core.memory import (
    GPUMemoryOptimizer,
    default_batch_sizes,
    optimize_model_memory,
    profile_memory_usage,
)
from core.transforms import is_checkpointed


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_the_breakdown_of_a_fully_trainable_model_with_adamw() -> None:
    model = mlp()
    profiles = profile_memory_usage(model, (1024, 64), batch_sizes=[256, 512, 1024])
    assert sorted(profiles) == [256, 512, 1024]
    params, tensors = param_bytes(model), len(list(model.parameters()))
    for profile in profiles.values():
        assert profile["parameters_bytes"] == params
        assert profile["gradients_bytes"] == params
        # exp_avg and exp_avg_sq per parameter, plus a float32 step counter per parameter
        assert profile["optimizer_state_bytes"] == 2 * params + 4 * tensors
        peak = profile["peak_allocated_bytes"]
        assert peak is not None and profile["memory_used_gb"] == peak / 2**30
        assert profile["activations_bytes"] == peak - 4 * params - 4 * tensors
        assert profile["reserved_bytes"] is None and not profile["out_of_memory"]
    activations = [profiles[n]["activations_bytes"] or 0 for n in (256, 512, 1024)]
    assert 0 < activations[0] < activations[1] < activations[2]


def test_frozen_parameters_have_no_gradients_or_optimizer_state() -> None:
    model = mlp()
    model[0].requires_grad_(False)
    frozen = param_bytes(model[0])
    profile = profile_memory_usage(model, (32, 64), batch_sizes=[32])[32]
    assert profile["gradients_bytes"] == param_bytes(model) - frozen
    assert profile["optimizer_state_bytes"] == 2 * (param_bytes(model) - frozen) + 4 * 4
    sgd = profile_memory_usage(model, (32, 64), [32], optimizer_factory=torch.optim.SGD)
    assert sgd[32]["optimizer_state_bytes"] == 0  # plain SGD keeps no state


def test_default_batch_sizes_are_powers_of_two_up_to_the_input_batch() -> None:
    assert default_batch_sizes(32) == [4, 8, 16, 32]
    assert default_batch_sizes(100) == [8, 16, 32, 64, 100]
    assert default_batch_sizes(1) == [1]
    assert sorted(profile_memory_usage(mlp(), (32, 64))) == [4, 8, 16, 32]
    with pytest.raises(ConfigError, match=r"batch_sizes=\[0\] is invalid"):
        profile_memory_usage(mlp(), (32, 64), [0])


def test_the_seed_usage_of_the_profile() -> None:
    model = mlp()
    weights = model[0].weight.clone()
    memory_profile = GPUMemoryOptimizer().profile_memory_usage(model, (32, 64))
    for batch_size, profile in memory_profile.items():
        assert batch_size in (4, 8, 16, 32) and (profile["memory_used_gb"] or 0) > 0
    assert torch.equal(model[0].weight, weights)


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class Stack(nn.Module):
    def __init__(self, d: int = 64, layers: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))


def test_repeated_blocks_are_checkpointed_and_the_peak_drops() -> None:
    model = Stack()
    keys, weights = list(model.state_dict()), model.blocks[0].ff[0].weight.clone()
    memory_optimizer = GPUMemoryOptimizer()
    optimized = memory_optimizer.optimize_model_memory(model, (64, 16, 64))
    report = memory_optimizer.last_optimization
    assert optimized is model and report is not None
    assert report.activation_checkpointed == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
    assert all(is_checkpointed(block) for block in model.blocks)
    assert report.peak_after_bytes is not None and report.peak_before_bytes is not None
    assert report.peak_after_bytes < report.peak_before_bytes
    assert list(model.state_dict()) == keys
    assert torch.equal(model.blocks[0].ff[0].weight, weights)
    assert report.to_dict()["channels_last"] is False


def test_a_model_without_repeated_blocks_is_left_as_it_is() -> None:
    report = optimize_model_memory(mlp(), (32, 64))
    assert report.activation_checkpointed == () and not report.channels_last
    assert report.peak_before_bytes == report.peak_after_bytes


def test_named_blocks_that_match_nothing_are_an_error() -> None:
    with pytest.raises(ConfigError, match="activation_checkpointing="):
        optimize_model_memory(mlp(), (32, 64), activation_checkpointing=("NoSuchBlock",))
    with pytest.raises(ConfigError, match="channels_last='yes' is invalid"):
        optimize_model_memory(mlp(), (32, 64), channels_last="yes")  # type: ignore[arg-type]


def test_channels_last_can_be_forced_for_a_conv_net() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))
    report = optimize_model_memory(model, (4, 3, 8, 8), channels_last=True)
    assert report.channels_last and report.peak_after_bytes is not None
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not optimize_model_memory(nn.Sequential(nn.Conv2d(3, 8, 3)), (4, 3, 8, 8)).channels_last
