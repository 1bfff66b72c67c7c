"""Train the MoE example with core and read its routing by domain before and after.

Example::

    report = train_example(epochs=5, log_dir="logs")
    report.purity("before"), report.purity("after"), report.val_accuracy
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import torch
from torch.utils.data import TensorDataset

from core import create_optimized_training_optimizer, seed_everything
from examples.moe import DOMAINS, SEQ_LEN, build_data, build_model, domain_sequences
from examples.moe.routing import Grouping, purity, routing_tables

__all__ = ("SETTINGS", "RoutingReport", "Tables", "probe_set", "train_example")

SETTINGS: dict[str, Any] = {"learning_rate": 3e-3, "max_grad_norm": 1.0}
"""The optimizer settings of ``examples/moe/config.toml``."""

Tables = dict[str, dict[str, torch.Tensor]]
"""``{"domain" | "class": {layer name: [groups, experts] shares}}``."""


def probe_set() -> TensorDataset:
    """512 held-out sequences (seed 2: neither the training nor the validation seed)."""
    return domain_sequences(512, domains=DOMAINS, seq_len=SEQ_LEN, seed=2)


@dataclass(frozen=True)
class RoutingReport:
    """Routing tables by domain and by class, before and after training."""

    before: Tables
    after: Tables
    val_accuracy: float | None
    run_dir: Path

    def purity(self, when: str, by: Grouping = "class", layer: str | None = None) -> float:
        """Purity of ``layer``'s table (default: the last MoE layer) ``"before"``/``"after"``
        training, its rows the classes or the domains (``by``)."""
        tables = (self.before if when == "before" else self.after)[by]
        return purity(tables[layer if layer is not None else list(tables)[-1]])


def train_example(
    *,
    epochs: int = 5,
    seed: int = 0,
    train_samples: int = 2048,
    experts: int = 4,
    log_dir: str | Path = "logs",
    progress: bool = True,
) -> RoutingReport:
    """Train ``build_model(experts=experts)`` on the example's data with core (one process,
    this machine's device) and read the routing on :func:`probe_set` around it."""
    seed_everything(seed)
    model = build_model(experts=experts)
    train_loader, val_loader = build_data(32, 0, train_samples=train_samples)
    probe = probe_set()
    before = _tables(model, probe)
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=train_loader,
        val_loader=val_loader,
        max_epochs=epochs,
        seed=seed,
        log_dir=log_dir,
        experiment_name="moe",
        progress=progress,
        **SETTINGS,
    )
    try:
        results = anyio.run(optimizer.train)
    finally:
        optimizer.close()
    after = _tables(model, probe)
    return RoutingReport(before, after, results.val_accuracy, results.run_dir)


def _tables(model: torch.nn.Module, probe: TensorDataset) -> Tables:
    return {by: routing_tables(model, probe, by=by) for by in ("domain", "class")}
