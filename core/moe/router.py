"""Top-k gating: which experts each token goes to, with what weight, and what is dropped.
An expert serves first choices first (GShard's priority) up to its ``capacity``; the
load-balancing loss is Switch Transformer's (1.0 for uniform routing). See docs/experts.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ("Routing", "TopKRouter", "load_balancing_loss", "route")


@dataclass(frozen=True)
class Routing:
    """One forward's routing of ``T`` tokens to ``E`` experts (device tensors)."""

    experts: torch.Tensor
    """``[T, top_k]`` expert index of each token's choices, best first."""
    weights: torch.Tensor
    """``[T, top_k]`` fp32 weight of each choice in the token's output."""
    keep: torch.Tensor
    """``[T, top_k]`` bool: the choice fits its expert's capacity."""
    counts: torch.Tensor
    """``[E]`` int64: assignments each expert takes (after dropping)."""
    dropped: torch.Tensor
    """``[]`` int64: assignments dropped for capacity."""
    aux_loss: torch.Tensor
    """``[]`` fp32: the load-balancing loss (differentiable through the router)."""
    capacity: int | None
    """Assignments an expert takes at most (None: unlimited)."""


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """``E * sum_e f_e * P_e`` for router probabilities ``probs`` ``[T, E]`` and the chosen
    ``experts`` ``[T, top_k]`` (Switch Transformer, eq. 4, over all ``top_k`` choices): ``f_e``
    the share of assignments routed to ``e`` (before dropping), ``P_e`` the mean router
    probability of ``e``."""
    n_experts = probs.shape[-1]
    assigned = torch.zeros(n_experts, dtype=torch.float32, device=probs.device)
    chosen = experts.reshape(-1)
    assigned.scatter_add_(0, chosen, torch.ones_like(chosen, dtype=torch.float32))
    fraction = assigned / experts.numel()
    return n_experts * (fraction * probs.float().mean(0)).sum()


def route(
    logits: torch.Tensor, top_k: int, capacity_factor: float | None, *, normalize: bool = True
) -> Routing:
    """Route tokens by their router ``logits`` ``[T, E]``: each picks its ``top_k`` experts by
    softmax probability (weights renormalised over them when ``normalize``); an expert takes
    at most its capacity of assignments, first choices first, in token order, so a token
    loses its second expert before any token loses its first; the rest are dropped."""
    tokens, n_experts = logits.shape
    probs = logits.float().softmax(dim=-1)
    weights, experts = probs.topk(top_k, dim=-1)
    if normalize and top_k > 1:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    capacity = None  # no limit
    if capacity_factor is not None:
        capacity = max(1, math.ceil(capacity_factor * tokens * top_k / n_experts))
    # Priority order: every token's first choice, then every token's second, ...
    by_priority = experts.t().reshape(-1)
    onehot = F.one_hot(by_priority, n_experts)
    position = onehot.cumsum(0).gather(1, by_priority[:, None]).squeeze(1) - 1
    kept = position < (capacity if capacity is not None else math.inf)
    counts = (onehot * kept[:, None]).sum(0)
    return Routing(
        experts=experts,
        weights=weights,
        keep=kept.reshape(top_k, tokens).t(),
        counts=counts,
        dropped=(~kept).sum(),
        aux_loss=load_balancing_loss(probs, experts),
        capacity=capacity,
    )


class TopKRouter(nn.Module):
    """One gate vector per expert (an ``nn.ParameterList``, so :meth:`add_expert` extends
    it without replacing parameters an optimizer holds); logits in fp32."""

    def __init__(self, d_model: int, num_experts: int, top_k: int = 2) -> None:
        super().__init__()
        self.d_model = d_model
        self.top_k = top_k
        self.gates = nn.ParameterList([self._new_gate() for _ in range(num_experts)])

    def _new_gate(self, device: torch.device | None = None) -> nn.Parameter:
        gate = torch.empty(self.d_model, device=device)
        nn.init.normal_(gate, std=self.d_model**-0.5)
        return nn.Parameter(gate)

    @property
    def num_experts(self) -> int:
        return len(self.gates)

    def add_expert(self) -> nn.Parameter:
        """A new gate (on the other gates' device) for a new expert; returns it."""
        gate = self._new_gate(self.gates[0].device)
        self.gates.append(gate)
        return gate

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[T, E]`` fp32 logits for ``tokens`` ``[T, d]``, autocast or not."""
        weight = torch.stack(list(self.gates))
        # fp32 even under autocast: small logit differences decide the routing, bf16 blurs them.
        with torch.autocast(tokens.device.type, enabled=False):
            return F.linear(tokens.float(), weight.float())

    def forward(
        self, tokens: torch.Tensor, capacity_factor: float | None, normalize: bool = True
    ) -> Routing:
        return route(self.logits(tokens), self.top_k, capacity_factor, normalize=normalize)
