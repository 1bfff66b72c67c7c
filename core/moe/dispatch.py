"""From routed tokens to the experts and back: in one process, or over expert-parallel ranks.
The kept assignments are sorted by expert (stable), every expert runs on its rows (one with none
runs on an empty batch, so its gradients are zeros rather than missing), and each output row,
times its routing weight, is added to its token's output. Over ranks (:func:`dispatch_parallel`)
expert ``e`` lives on rank ``e // experts_per_rank``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.moe.exchange import TokenExchange, exchange_tokens
from core.moe.experts import ExpertGroup
from core.moe.router import Routing

__all__ = ("ExpertShard", "dispatch_local", "dispatch_parallel")


@dataclass(frozen=True)
class ExpertShard:
    """This rank's share of the experts: ``experts_per_rank`` consecutive global indices."""

    rank: int
    world_size: int
    experts_per_rank: int
    exchange: TokenExchange

    def owned(self) -> list[int]:
        first = self.rank * self.experts_per_rank
        return list(range(first, first + self.experts_per_rank))


def _sorted_assignments(
    tokens: torch.Tensor, routing: Routing
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of the kept assignments sorted by expert, their tokens' indices, their weights."""
    top_k = routing.experts.shape[1]
    kept = routing.keep.reshape(-1).nonzero().squeeze(1)  # dynamic shape: a sync on CUDA
    order = routing.experts.reshape(-1)[kept].sort(stable=True).indices
    chosen = kept[order]
    token_index = chosen // top_k
    return tokens[token_index], token_index, routing.weights.reshape(-1)[chosen]


def _combine(
    like: torch.Tensor, outputs: torch.Tensor, token_index: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    combined = outputs.new_zeros((like.shape[0], outputs.shape[-1]))
    return combined.index_add(0, token_index, outputs * weights[:, None].to(outputs.dtype))


def dispatch_local(tokens: torch.Tensor, routing: Routing, experts: ExpertGroup) -> torch.Tensor:
    """Every expert in this process (each on its own device, if placed): ``[T, d]`` out."""
    rows, token_index, weights = _sorted_assignments(tokens, routing)
    counts = routing.counts.tolist()  # split sizes: a sync on CUDA
    outputs = []
    for (_, expert), part in zip(experts.held_items(), rows.split(counts), strict=True):
        device = _device_of(expert, part.device)
        out = expert(part.to(device, non_blocking=True))
        outputs.append(out.to(part.device, non_blocking=True))
    return _combine(tokens, torch.cat(outputs), token_index, weights)


def dispatch_parallel(
    tokens: torch.Tensor, routing: Routing, experts: ExpertGroup, shard: ExpertShard
) -> torch.Tensor:
    """This rank's tokens through experts spread over ranks: ``[T, d]`` out."""
    rows, token_index, weights = _sorted_assignments(tokens, routing)
    size, per_rank = shard.world_size, shard.experts_per_rank
    counts = routing.counts.reshape(size, per_rank)
    incoming = shard.exchange.exchange_counts(counts).tolist()  # [source][local expert]
    in_splits = counts.sum(1).tolist()
    out_splits = [sum(row) for row in incoming]
    received = exchange_tokens(rows, shard.exchange, out_splits, in_splits)
    pieces = received.split([n for row in incoming for n in row])  # (source, local expert)
    outputs: list[list[torch.Tensor]] = [[] for _ in range(size)]
    for j, (_, expert) in enumerate(experts.held_items()):
        batch = torch.cat([pieces[s * per_rank + j] for s in range(size)])
        done = expert(batch).split([incoming[s][j] for s in range(size)])
        for s in range(size):
            outputs[s].append(done[s])
    back = torch.cat([piece for source in outputs for piece in source])
    returned = exchange_tokens(back, shard.exchange, in_splits, out_splits)
    return _combine(tokens, returned, token_index, weights)


def _device_of(module: torch.nn.Module, default: torch.device) -> torch.device:
    for parameter in module.parameters():
        return parameter.device
    return default
