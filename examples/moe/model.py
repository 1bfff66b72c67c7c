"""A small transformer classifier whose feed-forward blocks are MoE layers."""

from __future__ import annotations

import torch
from torch import nn

from core.moe import MoELayer

__all__ = ("MoEBlock", "MoETransformer")


class MoEBlock(nn.Module):
    """Pre-norm self-attention, then a routed feed-forward (both residual)."""

    def __init__(
        self, d_model: int, heads: int, experts: int, top_k: int, capacity_factor: float | None
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attention = nn.MultiheadAttention(d_model, heads, bias=False, batch_first=True)
        self.norm2 = nn.LayerNorm(d_model)
        self.moe = MoELayer(
            d_model, experts, 2 * d_model, top_k=top_k, capacity_factor=capacity_factor
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.moe(self.norm2(x))


class MoETransformer(nn.Module):
    """Token ids ``[batch, seq]`` -> class logits ``[batch, classes]`` (mean-pooled)."""

    def __init__(
        self,
        vocab: int,
        classes: int,
        *,
        seq_len: int = 16,
        d_model: int = 32,
        heads: int = 4,
        layers: int = 2,
        experts: int = 4,
        top_k: int = 1,
        capacity_factor: float | None = 1.25,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(seq_len, d_model))
        self.blocks = nn.ModuleList(
            [MoEBlock(d_model, heads, experts, top_k, capacity_factor) for _ in range(layers)]
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))
