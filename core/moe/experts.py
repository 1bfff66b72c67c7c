"""Experts: independent feed-forward networks, held by their global index.

An :class:`ExpertGroup` is an ``nn.ModuleDict`` of experts keyed by their global index
(``"0"``, ``"1"``, ...). Under expert parallelism each rank keeps only its own
experts, so a parameter's name (``...moe.experts.5.up.weight``) is the same on every
world size: a sharded checkpoint names every expert once, and one process can load them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

__all__ = ("ExpertFactory", "ExpertGroup", "FeedForwardExpert")

ExpertFactory = Callable[[], nn.Module]


class FeedForwardExpert(nn.Module):
    """``down(act(up(x)))``: a transformer feed-forward block."""

    def __init__(
        self, d_model: int, hidden_size: int, activation: Callable[[], nn.Module] = nn.GELU
    ) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, hidden_size)
        self.act = activation()
        self.down = nn.Linear(hidden_size, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.act(self.up(x))
        out: torch.Tensor = self.down(hidden)
        return out


class ExpertGroup(nn.ModuleDict):
    """``num_experts`` experts built by ``factory``; this process may hold only some."""

    def __init__(self, factory: ExpertFactory, num_experts: int) -> None:
        super().__init__({str(i): factory() for i in range(num_experts)})
        self.factory = factory
        self.num_experts = num_experts
        """Experts in the whole model, held here or on other ranks."""

    @property
    def held(self) -> list[int]:
        """Global indices of the experts this process holds, ascending."""
        return sorted(int(key) for key in self.keys())

    def expert(self, index: int) -> nn.Module:
        return self[str(index)]

    def held_items(self) -> Iterator[tuple[int, nn.Module]]:
        """``(global index, expert)`` of the experts held, ascending."""
        for index in self.held:
            yield index, self[str(index)]

    def keep_only(self, indices: list[int]) -> None:
        """Drop every expert not in ``indices`` (this rank's share under expert parallel)."""
        for index in self.held:
            if index not in indices:
                del self[str(index)]

    def add(self) -> tuple[int, nn.Module]:
        """Build one more expert (global index ``num_experts``)."""
        index = self.num_experts
        expert = self.factory()
        self[str(index)] = expert
        self.num_experts += 1
        return index, expert
