"""Models for the benchmarks: a small MLP where per-step overhead shows, GPT-2 small, and a
ResNet-50-shaped CNN."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def mlp(features: int = 256, hidden: int = 512, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Linear(hidden, classes),
    )


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-2 shaped decoder (124M parameters at the default sizes), as in nanoGPT."""

    def __init__(
        self, vocab: int = 50304, ctx: int = 1024, d: int = 768, layers: int = 12, heads: int = 12
    ) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x)).transpose(1, 2)  # [B, vocab, T] for cross_entropy


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1x1 down, 3x3 (carrying the stride), 1x1 up, plus shortcut."""

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(inputs, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, out, 1, bias=False),
            nn.BatchNorm2d(out),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet(
    stages: tuple[int, ...] = (3, 4, 6, 3), width: int = 64, classes: int = 1000
) -> nn.Module:
    """A bottleneck ResNet; the defaults are ResNet-50's layout (25.6M parameters), without
    torchvision. ``width`` scales every stage (64, 128, 256, 512 at the default)."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    inputs = width
    for i, blocks in enumerate(stages):
        for j in range(blocks):
            stride = 2 if i > 0 and j == 0 else 1
            layers.append(Bottleneck(inputs, width * 2**i, stride))
            inputs = 4 * width * 2**i
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, classes)]
    return nn.Sequential(*layers)
