"""Activation checkpointing: the blocks chosen, gradients unchanged (dropout included),
state_dict keys unchanged, idempotent and reversible, clear errors, and less peak memory."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from core.errors import ConfigError
from core.memory import meter_for
from core.transforms import (
    ModelTransformsConfig,
    apply_activation_checkpointing,
    find_blocks,
    is_checkpointed,
    remove_activation_checkpointing,
)


class Block(nn.Module):
    def __init__(self, d: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return x + scale * self.drop(self.mlp(self.norm(x)))


class Net(nn.Module):
    def __init__(self, d: int = 16, layers: int = 3, dropout: float = 0.0) -> None:
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d, dropout) for _ in range(layers))
        self.head = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, scale=0.5)  # a keyword argument must pass through the checkpoint
        return self.head(h)


def grads_after_backward(model: nn.Module, x: torch.Tensor, seed: int = 0) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    model(x).square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def test_the_default_policy_picks_repeated_composite_blocks_only() -> None:
    assert [name for name, _ in find_blocks(Net())] == ["blocks.0", "blocks.1", "blocks.2"]
    lone_layers = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    assert find_blocks(lone_layers) == []


def test_named_types_pick_every_outermost_module_of_those_classes() -> None:
    model = Net()
    assert [name for name, _ in find_blocks(model, ("Block",))] == [f"blocks.{i}" for i in range(3)]
    by_class = [name for name, _ in find_blocks(model, (Block, "Linear"))]
    assert by_class == ["inp", "blocks.0", "blocks.1", "blocks.2", "head"]  # no Linear in a Block


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_gradients_equal_the_unchecked_models(dropout: float) -> None:
    torch.manual_seed(0)
    plain = Net(dropout=dropout)
    checked = copy.deepcopy(plain)
    assert apply_activation_checkpointing(checked) == ["blocks.0", "blocks.1", "blocks.2"]
    x = torch.randn(32, 8)
    expected, got = grads_after_backward(plain, x), grads_after_backward(checked, x)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    if dropout:  # the recomputed forward drew the same dropout masks: not a vacuous check
        assert not torch.equal(expected[0], grads_after_backward(plain, x, seed=1)[0])


def test_state_dict_keys_are_unchanged_and_a_second_call_does_not_wrap_twice() -> None:
    plain, checked = Net(), Net()
    names = apply_activation_checkpointing(checked, ("Block",))
    assert apply_activation_checkpointing(checked, ("Block",)) == names
    assert list(checked.state_dict()) == list(plain.state_dict())
    checked.load_state_dict(plain.state_dict())  # strict: old checkpoints still load
    wrapper = checked.blocks[0].forward
    assert not is_checkpointed(nn.Module()) and is_checkpointed(checked.blocks[0])
    assert wrapper.inner.__self__ is checked.blocks[0]  # the original, not a wrapper
    x = torch.randn(4, 8)
    assert torch.allclose(checked(x), plain(x), atol=1e-6)


def test_remove_restores_the_plain_forwards() -> None:
    model = Net()
    apply_activation_checkpointing(model)
    assert remove_activation_checkpointing(model) == ["blocks.0", "blocks.1", "blocks.2"]
    assert all("forward" not in block.__dict__ for block in model.blocks)
    assert remove_activation_checkpointing(model) == []


def test_evaluation_without_grad_runs_the_blocks_directly() -> None:
    model = Net()
    reference = model(torch.ones(2, 8))
    apply_activation_checkpointing(model)
    with torch.no_grad():
        assert torch.allclose(model(torch.ones(2, 8)), reference)


def test_nothing_to_checkpoint_is_a_config_error_naming_the_fix() -> None:
    flat = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    with pytest.raises(ConfigError, match=r"activation_checkpointing=True is invalid.*Fix: "):
        apply_activation_checkpointing(flat)
    unknown = r"activation_checkpointing=\('Nope',\) is invalid.*Block"
    with pytest.raises(ConfigError, match=unknown):
        apply_activation_checkpointing(Net(), ("Nope",))


def test_the_config_field_accepts_flags_and_class_names() -> None:
    assert ModelTransformsConfig().activation_checkpointing is False
    names = ModelTransformsConfig(activation_checkpointing=["Block"])  # type: ignore[arg-type]
    assert names.activation_checkpointing == ("Block",)
    for bad in ("yes", (), ("",), ("Block", 3)):
        with pytest.raises(ConfigError, match=r"^activation_checkpointing=.* is invalid"):
            ModelTransformsConfig(activation_checkpointing=bad)  # type: ignore[arg-type]


def peak_activation_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Peak bytes allocated during forward and backward above what was alive before."""

    def step() -> None:
        model(x).square().mean().backward()

    reading = meter_for(torch.device("cpu")).measure(step, resident=[*model.parameters(), x])
    return reading.peak_bytes - reading.start_bytes


def test_checkpointing_lowers_peak_memory() -> None:
    torch.manual_seed(0)
    model = Net(d=32, layers=4)
    x = torch.randn(256, 8)
    plain = peak_activation_bytes(model, x)
    apply_activation_checkpointing(model)
    model.zero_grad(set_to_none=True)
    checked = peak_activation_bytes(model, x)
    assert checked < 0.7 * plain, (checked, plain)
