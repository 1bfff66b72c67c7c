"""Where each expert lives on a machine with several GPUs, by a cost model. An expert's cost
(parameters x its expected share of tokens) is placed largest first on the device with the
smallest ``(load + cost) / SM count`` among those with room for its training memory. The gate
and everything dense stay on the primary device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = (
    "BYTES_PER_PARAMETER",
    "DeviceDescription",
    "ExpertCost",
    "PlacementPlan",
    "describe_cuda_devices",
    "plan_placement",
)

BYTES_PER_PARAMETER = 16
"""Training memory per fp32 parameter: weight, gradient, two Adam moments."""


@dataclass(frozen=True)
class DeviceDescription:
    """What the cost model knows of a device."""

    device: str
    """A torch device string, e.g. ``cuda:1``."""
    name: str
    sm_count: int
    free_memory_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExpertCost:
    """One expert: its name (``layer.index``), parameters and expected token share."""

    name: str
    parameters: int
    token_share: float

    @property
    def cost(self) -> float:
        return self.parameters * self.token_share


def describe_cuda_devices() -> list[DeviceDescription]:
    """This machine's CUDA devices (free memory from the driver; a call per device)."""
    described = []
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        properties = torch.cuda.get_device_properties(index)
        free, _ = torch.cuda.mem_get_info(index)
        sm_count = properties.multi_processor_count
        described.append(DeviceDescription(f"cuda:{index}", properties.name, sm_count, free))
    return described


@dataclass
class _Load:
    device: DeviceDescription
    cost: float = 0.0
    bytes: int = 0
    experts: list[str] = field(default_factory=list)

    def score(self, extra: float) -> tuple[float, int]:
        return (self.cost + extra) / max(self.device.sm_count, 1), len(self.experts)

    def fits(self, parameters: int) -> bool:
        return self.bytes + parameters * BYTES_PER_PARAMETER <= self.device.free_memory_bytes


class PlacementPlan:
    """Experts assigned to devices; grows as experts are added."""

    def __init__(self, devices: list[DeviceDescription]) -> None:
        if not devices:
            raise ValueError("a placement plan needs at least one device")
        self.loads = [_Load(d) for d in devices]
        self.assignment: dict[str, str] = {}

    def place(self, expert: ExpertCost, *, least_loaded: bool = False) -> str:
        """Put ``expert`` where its finish ``(load + cost) / SMs`` is earliest, or (with
        ``least_loaded``) on the device whose ``load / SMs`` is lowest; its device."""
        fitting = [load for load in self.loads if load.fits(expert.parameters)] or self.loads
        extra = 0.0 if least_loaded else expert.cost
        best = min(fitting, key=lambda load: load.score(extra))
        best.cost += expert.cost
        best.bytes += expert.parameters * BYTES_PER_PARAMETER
        best.experts.append(expert.name)
        self.assignment[expert.name] = best.device.device
        return best.device.device

    def place_new(self, name: str, parameters: int, token_share: float | None = None) -> str:
        """A new expert's device: the least-loaded one (its share defaults to the mean)."""
        share = token_share if token_share is not None else self._mean_share()
        return self.place(ExpertCost(name, parameters, share), least_loaded=True)

    def _mean_share(self) -> float:
        placed = sum(len(load.experts) for load in self.loads)
        return 1.0 / max(placed, 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": [
                load.device.to_dict() | {"experts": list(load.experts), "cost": load.cost}
                for load in self.loads
            ],
            "assignment": dict(self.assignment),
        }


def plan_placement(experts: list[ExpertCost], devices: list[DeviceDescription]) -> PlacementPlan:
    """Place ``experts`` on ``devices``, largest cost first (stable for equal costs)."""
    plan = PlacementPlan(devices)
    for expert in sorted(experts, key=lambda e: -e.cost):
        plan.place(expert)
    return plan
