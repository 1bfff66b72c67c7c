"""Mixture of experts: top-k routing with capacity and a load-balancing loss, independent
experts, the token exchange of expert parallelism, and the placement of experts on the
devices of one machine. Knows nothing of the step loop or the strategies that use it."""

from __future__ import annotations

from core.moe.experts import ExpertGroup, FeedForwardExpert
from core.moe.layer import MoELayer
from core.moe.probe import MoEProbe, auxiliary_loss, moe_layers
from core.moe.router import Routing, TopKRouter, load_balancing_loss, route

__all__ = (
    "ExpertGroup",
    "FeedForwardExpert",
    "MoELayer",
    "MoEProbe",
    "Routing",
    "TopKRouter",
    "auxiliary_loss",
    "load_balancing_loss",
    "moe_layers",
    "route",
)
