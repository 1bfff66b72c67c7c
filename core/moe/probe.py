"""What a training step needs from a model's MoE layers: their loss terms and statistics.
:class:`MoEProbe` hands over their weighted load-balancing losses after each forward and packs
their counters into one device tensor at the end of the step (read back lagged into
``train_step``'s ``moe_*`` fields).

A hand-written loop adds the same term with :func:`auxiliary_loss`::

    loss = loss_fn(model(x), y) + auxiliary_loss(model)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from core.errors import ConfigError
from core.moe.layer import MoELayer

__all__ = ("MoEProbe", "StepTerms", "auxiliary_loss", "moe_layers", "require_moe_layers")

StepFields = Callable[[Sequence[float]], dict[str, Any]]


def moe_layers(model: nn.Module) -> list[tuple[str, MoELayer]]:
    """Every MoE layer in ``model`` with its qualified name, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, MoELayer)]


def require_moe_layers(model: nn.Module, fix: str) -> list[tuple[str, MoELayer]]:
    """:func:`moe_layers`, or a ConfigError for an expert strategy given a dense model."""
    layers = moe_layers(model)
    if not layers:
        raise ConfigError(
            "training_mode='expert_parallel' needs a model with core.moe.MoELayer blocks, "
            f"and {type(model).__name__} has none. Fix: {fix}."
        )
    return layers


def auxiliary_loss(model: nn.Module) -> torch.Tensor | float:
    """The sum of ``aux_loss_weight * loss`` of the layers' last training forwards (taken:
    a second call returns 0.0 until the next forward)."""
    probe = MoEProbe.of(model)
    term = None if probe is None else probe.auxiliary_loss()
    return 0.0 if term is None else term


class StepTerms:
    """One step's statistics on the device, and how their host values become fields."""

    __slots__ = ("fields", "tensor")

    def __init__(self, tensor: torch.Tensor, fields: StepFields) -> None:
        self.tensor = tensor
        self.fields = fields


class MoEProbe:
    """The MoE layers of a model, as the step loop sees them."""

    def __init__(self, layers: list[tuple[str, MoELayer]]) -> None:
        self.layers = layers

    @classmethod
    def of(cls, model: nn.Module) -> MoEProbe | None:
        """A probe of ``model``'s MoE layers, or None when it has none."""
        layers = moe_layers(model)
        return cls(layers) if layers else None

    def begin_step(self) -> None:
        for _, layer in self.layers:
            layer.reset_stats()

    def auxiliary_loss(self) -> torch.Tensor | None:
        total: torch.Tensor | None = None
        for _, layer in self.layers:
            aux, layer.aux_loss = layer.aux_loss, None
            if aux is not None and layer.aux_loss_weight:
                term = layer.aux_loss_weight * aux
                total = term if total is None else total + term
        return total

    def collect(self) -> StepTerms:
        layout = [(name, layer.num_experts, layer.forwards) for name, layer in self.layers]
        tensor = torch.cat([layer.stats_tensor() for _, layer in self.layers])

        def fields(values: Sequence[float]) -> dict[str, Any]:
            tokens: dict[str, list[int]] = {}
            dropped, losses, at = 0, [], 0
            for name, experts, forwards in layout:
                row = values[at : at + experts + 2]
                at += experts + 2
                tokens[name] = [round(v) for v in row[:experts]]
                dropped += round(row[experts])
                if forwards:
                    losses.append(row[experts + 1] / forwards)
            return {
                "moe_aux_loss": sum(losses) / len(losses) if losses else None,
                "moe_tokens_per_expert": tokens,
                "moe_dropped_tokens": dropped,
            }

        return StepTerms(tensor.detach().clone(), fields)
