"""Where an MoE model sends each domain's tokens: the routing table, and how pure it is.

A forward hook on every :class:`~core.moe.layer.MoELayer` keeps the tokens the layer
receives; the layer's router scores them (``layer.router.logits``) and each token counts
for its first choice. Grouping the tokens by their sequence's domain (the class ``// 2`` in
:func:`~examples.moe.data.domain_sequences`) gives a ``[domains, experts]`` table of shares:
row ``d`` says which experts domain ``d``'s tokens go to. ``purity`` is the mean over
domains of a row's largest share: 1.0 when every domain has an expert of its own, about
``1 / experts`` (more for a few tokens) when routing ignores the domain.

Example::

    table = routing_by_domain(model, domain_sequences(512, seed=3))
    print(format_table(table), purity(table))
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn
from torch.utils.data import TensorDataset

from core.moe import MoELayer, moe_layers
from examples.moe.data import domains_of

__all__ = ("Grouping", "format_table", "purity", "routing_by_domain", "routing_tables")

Grouping = Literal["domain", "class"]


@torch.no_grad()
def routing_tables(
    model: nn.Module, dataset: TensorDataset, *, by: Grouping = "domain", batch_size: int = 256
) -> dict[str, torch.Tensor]:
    """``{layer name: [groups, experts] shares}`` for every MoE layer of ``model``, a row per
    domain (``by="domain"``) or per class (``by="class"``: domain ``d``'s sequences with few
    markers, then with many); evaluated in eval mode, the model's mode restored after."""
    tokens, labels = dataset.tensors[0], dataset.tensors[1]
    domain = domains_of(labels) if by == "domain" else labels
    domains = int(domain.max()) + 1  # host value: the table's size
    layers = moe_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no core.moe.MoELayer blocks")
    counts = {name: torch.zeros(domains, layer.num_experts) for name, layer in layers}
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Any:
        def hook(layer: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            seen[name] = args[0].detach()

        return hook

    handles = [layer.register_forward_pre_hook(keep(name)) for name, layer in layers]
    device = next(model.parameters()).device
    training = model.training
    model.eval()
    try:
        for start in range(0, len(tokens), batch_size):
            batch = tokens[start : start + batch_size].to(device)
            rows = domain[start : start + batch_size]
            model(batch)
            for name, layer in layers:
                _count(counts[name], layer, seen[name], rows, batch.shape[1])
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()
    return {name: c / c.sum(dim=1, keepdim=True).clamp(min=1) for name, c in counts.items()}


def _count(
    table: torch.Tensor, layer: MoELayer, x: torch.Tensor, rows: torch.Tensor, seq: int
) -> None:
    """Add each token's first choice to its sequence's domain row of ``table``."""
    first = layer.router.logits(x.reshape(-1, x.shape[-1])).argmax(dim=-1).cpu()
    token_domain = rows.repeat_interleave(seq)
    flat = token_domain * table.shape[1] + first
    table.view(-1).add_(torch.bincount(flat, minlength=table.numel()).float())


def routing_by_domain(
    model: nn.Module, dataset: TensorDataset, *, layer: str | None = None, by: Grouping = "domain"
) -> torch.Tensor:
    """``[domains, experts]``: the share of each domain's tokens whose first choice is each
    expert, in MoE layer ``layer`` (a qualified name such as ``"blocks.0.moe"``; default:
    the last MoE layer, whose tokens carry the most of their sequence's context)."""
    tables = routing_tables(model, dataset, by=by)
    name = layer if layer is not None else list(tables)[-1]
    if name not in tables:
        raise ValueError(f"layer {name!r}: not an MoE layer; allowed: {', '.join(tables)}")
    return tables[name]


def purity(table: torch.Tensor) -> float:
    """Mean over domains of the largest share in their row (1.0: one expert per domain)."""
    return float(table.max(dim=1).values.mean())


def format_table(table: torch.Tensor, by: Grouping = "domain") -> str:
    """The table as text: a row per domain (or class: ``d0 few``, ``d0 many``, ...), a column
    per expert, shares in percent."""
    names = [str(d) for d in range(table.shape[0])]
    if by == "class":
        names = [f"d{c // 2} {'many' if c % 2 else 'few'}" for c in range(table.shape[0])]
    width = max(len(by), *(len(n) for n in names))
    lines = [f"{by:<{width}} " + "".join(f"{f'e{e}':>6}" for e in range(table.shape[1]))]
    for name, row in zip(names, table.tolist(), strict=True):
        lines.append(f"{name:<{width}} " + "".join(f"{100 * share:>5.0f}%" for share in row))
    return "\n".join(lines)
