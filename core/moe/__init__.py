"""Mixture of experts: top-k routing with capacity and a load-balancing loss, independent
experts, the token exchange of expert parallelism, and the placement of experts on the
devices of one machine. Knows nothing of the step loop or the strategies that use it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

# Each name's module loads when first asked for: importing one module of this package
# (a run imports a few) loads none of the others.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ExpertGroup": "core.moe.experts",
        "FeedForwardExpert": "core.moe.experts",
        "MoELayer": "core.moe.layer",
        "MoEProbe": "core.moe.probe",
        "Routing": "core.moe.router",
        "TopKRouter": "core.moe.router",
        "auxiliary_loss": "core.moe.probe",
        "load_balancing_loss": "core.moe.router",
        "moe_layers": "core.moe.probe",
        "route": "core.moe.router",
    },
)
