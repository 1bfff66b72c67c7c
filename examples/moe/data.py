"""Sequences from four domains, each with its own vocabulary: routing has something to learn.

A sequence belongs to one of ``domains`` domains and draws most of its tokens from that
domain's slice of the vocabulary (the rest are shared noise tokens). Its class is the domain
and whether the domain's *marker* token appears more than ``seq_len / 8`` times: 2 classes
per domain. The rule is linear in the mean of the token embeddings, so the experts are not
needed for it and the first MoE layer's routing stays spread out; the last layer's router,
whose tokens carry their sequence's context, learns to send each *class* to an expert of its
own (``examples/moe/routing.py`` measures it; ``python -m examples.moe`` prints it).
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

__all__ = ("NOISE_TOKENS", "VOCAB_PER_DOMAIN", "domain_sequences", "domains_of", "vocabulary")

VOCAB_PER_DOMAIN = 16
NOISE_TOKENS = 8


def domain_sequences(
    n: int, *, domains: int = 4, seq_len: int = 16, noise: float = 0.2, seed: int = 0
) -> TensorDataset:
    """``n`` sequences ``[n, seq_len]`` (int64) and their classes ``[n]`` (``2 * domains``);
    the vocabulary is ``domains * 16 + 8`` tokens."""
    g = torch.Generator().manual_seed(seed)
    domain = torch.randint(domains, (n,), generator=g)
    own = (
        torch.randint(VOCAB_PER_DOMAIN, (n, seq_len), generator=g)
        + domain[:, None] * VOCAB_PER_DOMAIN
    )
    marker = domain * VOCAB_PER_DOMAIN  # the first token of each domain's slice
    plant = torch.rand(n, generator=g) < 0.5
    extra = torch.rand(n, seq_len, generator=g) < 0.3
    own = torch.where(plant[:, None] & extra, marker[:, None], own)
    noisy = torch.rand(n, seq_len, generator=g) < noise
    noise_ids = torch.randint(NOISE_TOKENS, (n, seq_len), generator=g) + domains * VOCAB_PER_DOMAIN
    tokens = torch.where(noisy, noise_ids, own)
    many = (tokens == marker[:, None]).sum(1) > seq_len // 8
    return TensorDataset(tokens, domain * 2 + many.long())


def vocabulary(domains: int = 4) -> int:
    """Tokens in the vocabulary of ``domains`` domains: ``vocabulary(4) == 72``."""
    return domains * VOCAB_PER_DOMAIN + NOISE_TOKENS


def domains_of(labels: torch.Tensor) -> torch.Tensor:
    """The domain of each sequence from its class (``class = 2 * domain + many``)."""
    return labels // 2
