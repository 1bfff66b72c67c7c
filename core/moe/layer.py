"""``MoELayer``: a mixture-of-experts feed-forward block (router + experts + statistics).

``forward(x)`` maps ``[..., d_model]`` to the same shape: every token goes to its ``top_k``
experts (:mod:`core.moe.router`, :mod:`core.moe.dispatch`) and comes back as the
routing-weighted sum of their outputs. While training, each forward keeps its load-balancing
loss for the step and adds to per-step device counters.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import torch
from torch import nn

from core.errors import config_error
from core.moe.dispatch import ExpertShard, dispatch_local, dispatch_parallel
from core.moe.experts import ExpertFactory, ExpertGroup, FeedForwardExpert
from core.moe.router import TopKRouter

__all__ = ("MoELayer", "NewExpertPlacer")


class NewExpertPlacer(Protocol):
    """Where a new expert goes (the placement plan's least-loaded device)."""

    def place_new(self, name: str, parameters: int) -> torch.device: ...


class MoELayer(nn.Module):
    """Top-k routed experts in place of a transformer's feed-forward block.

    Example::

        block_ffn = MoELayer(d_model=64, num_experts=4, top_k=2, capacity_factor=1.25)
        y = block_ffn(x)                       # x: [batch, seq, 64]
    """

    def __init__(
        self,
        d_model: int,
        num_experts: int,
        hidden_size: int | None = None,
        *,
        top_k: int = 2,
        capacity_factor: float | None = 1.25,
        aux_loss_weight: float = 0.01,
        normalize_weights: bool = True,
        expert: ExpertFactory | None = None,
        activation: Callable[[], nn.Module] = nn.GELU,
    ) -> None:
        super().__init__()
        _check(
            d_model=d_model,
            num_experts=num_experts,
            top_k=top_k,
            capacity_factor=capacity_factor,
            aux_loss_weight=aux_loss_weight,
        )
        hidden = hidden_size or 4 * d_model
        factory = expert or partial(FeedForwardExpert, d_model, hidden, activation)
        self.d_model = d_model
        self.top_k = top_k
        self.capacity_factor = capacity_factor
        self.aux_loss_weight = aux_loss_weight
        self.normalize_weights = normalize_weights
        self.router = TopKRouter(d_model, num_experts, top_k)
        self.experts = ExpertGroup(factory, num_experts)
        self.shard: ExpertShard | None = None
        """Set by the expert-parallel strategy: this rank's experts and the exchange."""
        self.placer: NewExpertPlacer | None = None
        """Set by the single-process placement: where :meth:`add_expert` puts experts."""
        self.aux_loss: torch.Tensor | None = None
        """The last training forward's load-balancing loss (taken by the step)."""
        self._stats: torch.Tensor | None = None  # [E counts, dropped, aux sum]
        self.forwards = 0
        """Training forwards counted in the statistics since :meth:`reset_stats`."""

    @property
    def num_experts(self) -> int:
        return self.router.num_experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        routing = self.router(tokens, self.capacity_factor, self.normalize_weights)
        if self.training:
            self.aux_loss = routing.aux_loss
            self._count(routing.counts, routing.dropped, routing.aux_loss)
        if self.shard is None:
            out = dispatch_local(tokens, routing, self.experts)
        else:
            out = dispatch_parallel(tokens, routing, self.experts, self.shard)
        return out.to(x.dtype).reshape(x.shape) if out.dtype != x.dtype else out.reshape(x.shape)

    # -- statistics -----------------------------------------------------------------------
    def _count(self, counts: torch.Tensor, dropped: torch.Tensor, aux: torch.Tensor) -> None:
        extra = torch.stack([dropped.float(), aux.detach().float()])
        row = torch.cat([counts.float(), extra])
        if self._stats is None or self._stats.shape != row.shape:
            self._stats = torch.zeros_like(row)
        self._stats.add_(row)
        self.forwards += 1

    def reset_stats(self) -> None:
        if self._stats is not None:
            self._stats.zero_()
        self.forwards = 0
        self.aux_loss = None

    def stats_tensor(self) -> torch.Tensor:
        """``[E + 2]``: assignments per expert, dropped, summed loss, since the reset."""
        if self._stats is None or self._stats.shape[0] != self.num_experts + 2:
            device = self.router.gates[0].device
            self._stats = torch.zeros(self.num_experts + 2, device=device)
        return self._stats

    # -- growth ---------------------------------------------------------------------------
    def add_expert(self) -> nn.Module:
        """One more expert (and its gate); returns it. With a placement plan it goes to the
        least-loaded device. Give its parameters to the optimizer yourself
        (``optimizer.add_param_group({"params": [*expert.parameters(), gate]})``); the gate
        is ``layer.router.gates[-1]``. Not under expert parallelism (the ranks' shares are
        fixed for the run)."""
        if self.shard is not None:
            raise RuntimeError(
                "add_expert() under expert parallelism: each rank's experts are fixed for the "
                "run. Fix: add experts before training, or train in one process."
            )
        index, expert = self.experts.add()
        device = self.router.gates[0].device
        if self.placer is not None:
            parameters = sum(p.numel() for p in expert.parameters())
            device = self.placer.place_new(str(index), parameters)
        expert.to(device)
        self.router.add_expert()
        return expert

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, experts={self.num_experts}, top_k={self.top_k}, "
            f"capacity_factor={self.capacity_factor}, aux_loss_weight={self.aux_loss_weight}"
        )


def _check(**fields: Any) -> None:
    for name in ("d_model", "num_experts", "top_k"):
        value = fields[name]
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise config_error(name, value, "an integer >= 1")
    if fields["top_k"] > fields["num_experts"]:
        raise config_error("top_k", fields["top_k"], f"at most num_experts={fields['num_experts']}")
    factor = fields["capacity_factor"]
    if factor is not None and not (isinstance(factor, (int, float)) and factor > 0):
        raise config_error("capacity_factor", factor, "None (no dropping) or a number > 0")
    weight = fields["aux_loss_weight"]
    if not (isinstance(weight, (int, float)) and weight >= 0):
        raise config_error("aux_loss_weight", weight, "a number >= 0 (0: no balancing loss)")
