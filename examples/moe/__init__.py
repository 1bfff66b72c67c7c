"""Seed 003's mixture-of-experts example: sequences from four domains (each with its own
slice of the vocabulary) classified by a small transformer whose feed-forward blocks are MoE
layers, as ``core-train`` factories, and the routing table that shows what the router
learned::

    python -m examples.moe                                  # routing before/after, accuracy
    core-train --example moe --config examples/moe/config.toml --experts 8
    python examples/gpu_training_example.py --parallel-strategy expert_parallel
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.data import DataLoader

from .data import VOCAB_PER_DOMAIN, domain_sequences, domains_of, vocabulary
from .model import MoEBlock, MoETransformer
from .routing import format_table, purity, routing_by_domain, routing_tables

__all__ = (
    "DOMAINS",
    "MODEL_DEFAULTS",
    "SEQ_LEN",
    "VOCAB_PER_DOMAIN",
    "MoEBlock",
    "MoETransformer",
    "build_data",
    "build_model",
    "domain_sequences",
    "domains_of",
    "format_table",
    "purity",
    "routing_by_domain",
    "routing_tables",
    "vocabulary",
)

DOMAINS = 4
SEQ_LEN = 16
MODEL_DEFAULTS: dict[str, Any] = {
    "seq_len": SEQ_LEN,
    "d_model": 32,
    "heads": 4,
    "layers": 2,
    "experts": 4,
    "top_k": 1,
}
"""``build_model``'s settings: small enough for a CPU epoch in a couple of seconds."""


def build_model(**kwargs: Any) -> nn.Module:
    """The model factory of ``core-train --example moe``: an ``MoETransformer`` over the
    four domains' vocabulary, 8 classes; keywords override :data:`MODEL_DEFAULTS`
    (``--experts 8`` is ``experts=8``, ``--model-arg top_k=2``...).

    >>> build_model(experts=8).blocks[0].moe.num_experts
    8
    """
    return MoETransformer(vocabulary(DOMAINS), 2 * DOMAINS, **(MODEL_DEFAULTS | kwargs))


def build_data(
    batch_size: int = 32, num_workers: int = 0, *, train_samples: int = 2048
) -> tuple[DataLoader[Any], DataLoader[Any]]:
    """The data factory of ``core-train --example moe``: ``train_samples`` shuffled training
    sequences (seed 0) and 512 validation sequences (seed 1) of 16 tokens.

    >>> [len(loader) for loader in build_data(32, 0)]
    [64, 2]
    """
    train = domain_sequences(train_samples, domains=DOMAINS, seq_len=SEQ_LEN, seed=0)
    val = domain_sequences(512, domains=DOMAINS, seq_len=SEQ_LEN, seed=1)
    return (
        DataLoader(train, batch_size=batch_size, shuffle=True, num_workers=num_workers),
        DataLoader(val, batch_size=256, num_workers=num_workers),
    )
