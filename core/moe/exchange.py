"""Moving tokens between expert-parallel ranks, with autograd. Two ``all_to_all_single`` calls
with variable splits per MoE layer forward, two in backward, after a small all-to-all of
per-expert counts (a host sync per layer on CUDA). :class:`AllGatherExchange` builds the same
from ``all_gather`` for backends without all-to-all, moving ``world_size`` times the data. Both
count their collectives' seconds (on CUDA: the time to queue them).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import torch
import torch.distributed as dist

__all__ = ("AllGatherExchange", "TokenExchange", "exchange_tokens", "probe_all_to_all")


class TokenExchange:
    """All-to-all with variable splits over a process group (``None``: the default group)."""

    name = "all_to_all_single"

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.seconds = 0.0
        self.calls = 0

    def exchange_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """``counts`` ``[world_size, k]`` this rank sends each rank -> ``[world_size, k]``
        every rank sends this one (int64)."""
        received = torch.empty_like(counts)
        started = perf_counter()
        self._all_to_all(received.reshape(-1), counts.reshape(-1).contiguous(), None, None)
        self._count(started)
        return received

    def send(
        self, tokens: torch.Tensor, out_splits: list[int], in_splits: list[int]
    ) -> torch.Tensor:
        """Rows ``tokens[sum(in_splits[:r]):...]`` go to rank ``r``; returns the rows every
        rank sent here, ``out_splits[r]`` from rank ``r``, in rank order."""
        received = tokens.new_empty((sum(out_splits), *tokens.shape[1:]))
        started = perf_counter()
        self._all_to_all(received, tokens.contiguous(), out_splits, in_splits)
        self._count(started)
        return received

    def _count(self, started: float) -> None:
        self.seconds += perf_counter() - started
        self.calls += 1

    def _all_to_all(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int] | None,
        in_splits: list[int] | None,
    ) -> None:
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group)


class AllGatherExchange(TokenExchange):
    """The same exchange from ``all_gather``: for backends without ``all_to_all``."""

    name = "all_gather"

    def _all_to_all(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int] | None,
        in_splits: list[int] | None,
    ) -> None:
        size, me = self.world_size, dist.get_rank(self.group)
        rows = inp.shape[0]
        splits = in_splits if in_splits is not None else [rows // size] * size
        # Every rank's splits, so each knows where its part lies in every other's rows.
        mine = torch.tensor(splits, dtype=torch.int64, device=inp.device)
        table = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(table, mine, group=self.group)
        matrix = [[int(v) for v in row.tolist()] for row in table]
        longest = max(sum(row) for row in matrix)
        padded = inp.new_zeros((longest, *inp.shape[1:]))
        padded[:rows] = inp
        gathered = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(gathered, padded, group=self.group)
        parts = []
        for source, row in enumerate(matrix):
            start = sum(row[:me])
            parts.append(gathered[source][start : start + row[me]])
        out.copy_(torch.cat(parts))


def probe_all_to_all(group: Any = None) -> bool:
    """Whether the group's backend runs ``all_to_all_single`` (one 1-element exchange per rank)."""
    size = dist.get_world_size(group)
    gloo = dist.get_backend(group) == "gloo"
    device = torch.device("cpu") if gloo else torch.device("cuda", torch.cuda.current_device())
    try:
        dist.all_to_all_single(
            torch.empty(size, device=device), torch.zeros(size, device=device), group=group
        )
    except (RuntimeError, NotImplementedError):
        return False
    return True


class _Send(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        tokens: torch.Tensor,
        exchange: TokenExchange,
        out_splits: list[int],
        in_splits: list[int],
    ) -> torch.Tensor:
        ctx.exchange, ctx.out_splits, ctx.in_splits = exchange, out_splits, in_splits
        return exchange.send(tokens, out_splits, in_splits)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        # The rows came from where they go back to: the same exchange, splits swapped.
        return ctx.exchange.send(grad.contiguous(), ctx.in_splits, ctx.out_splits), None, None, None


def exchange_tokens(
    tokens: torch.Tensor, exchange: TokenExchange, out_splits: list[int], in_splits: list[int]
) -> torch.Tensor:
    """:meth:`TokenExchange.send` with autograd (backward sends the gradients back)."""
    result: torch.Tensor = _Send.apply(tokens, exchange, out_splits, in_splits)  # type: ignore[no-untyped-call]
    return result
