"""Expert parallelism in one process: experts placed on this machine's GPUs. The plan
(:mod:`core.moe.placement`) is recorded in ``run_start`` even with one device or none.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core.distributed.base import Strategy
from core.moe.layer import MoELayer
from core.moe.placement import DeviceDescription, ExpertCost, PlacementPlan, plan_placement
from core.moe.probe import require_moe_layers

__all__ = ("ExpertPlacementStrategy",)


class ExpertPlacementStrategy(Strategy):
    """One process: dense parts on ``device``, experts where the plan says."""

    def __init__(
        self, device: torch.device, devices: list[DeviceDescription], *, move: bool
    ) -> None:
        super().__init__(device, "expert_parallel")
        self.devices = devices
        self.move = move
        self.plan: PlacementPlan | None = None

    def describe(self) -> dict[str, Any]:
        placement = None if self.plan is None else self.plan.to_dict()
        return super().describe() | {"expert_placement": placement, "experts_moved": self.move}

    def wrap_model(
        self, model: nn.Module, *, compute_dtype: torch.dtype = torch.float32
    ) -> nn.Module:
        layers = require_moe_layers(model, "training_mode='auto'")
        model.to(self.device)
        costs = [
            ExpertCost(
                f"{name}.{index}",
                sum(p.numel() for p in expert.parameters()),
                layer.top_k / layer.num_experts,
            )
            for name, layer in layers
            for index, expert in layer.experts.held_items()
        ]
        devices = self.devices or [DeviceDescription(str(self.device), str(self.device), 1, 2**62)]
        self.plan = plan_placement(costs, devices)
        for name, layer in layers:
            layer.placer = _LayerPlacer(self, name, layer)
            if self.move:
                for index, expert in layer.experts.held_items():
                    expert.to(self.plan.assignment[f"{name}.{index}"])
        return model


class _LayerPlacer:
    """A layer's :meth:`~core.moe.layer.MoELayer.add_expert` asks the plan for a device."""

    def __init__(self, strategy: ExpertPlacementStrategy, name: str, layer: MoELayer) -> None:
        self.strategy, self.name, self.layer = strategy, name, layer

    def place_new(self, name: str, parameters: int) -> torch.device:
        plan = self.strategy.plan
        assert plan is not None
        share = self.layer.top_k / (self.layer.num_experts + 1)
        planned = plan.place_new(f"{self.name}.{name}", parameters, share)
        return torch.device(planned) if self.strategy.move else self.strategy.device
