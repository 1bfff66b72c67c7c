"""The hand-written loop of ``benchmarks.overhead`` run through Lightning Fabric and through
Hugging Face Accelerate, for peer rows in that benchmark.

Each peer wraps the same loop as ``overhead.hand_loop`` (fused AdamW, the same loss weighting
over an accumulation window, clipping at 1.0, one optimizer step per window): the model and
optimizer go through ``fabric.setup(...)`` / ``accelerator.prepare(...)``, the backward pass
through ``fabric.backward`` / ``accelerator.backward`` and clipping through the framework,
which also owns autocast and loss scaling. Building the framework object is inside the
round, as building the optimizer and the worker thread is for core. Both packages are
optional: a peer whose package is not importable is reported as "not installed".
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]
PeerLoop = Callable[[nn.Module, Sequence[Batch], int, int, str, torch.device], None]

_FABRIC_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
_ACCELERATE_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


@dataclass(frozen=True)
class Peer:
    name: str
    label: str
    module: str
    loop: PeerLoop

    @property
    def installed(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            return False


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)


def _windows(batches: Sequence[Batch], accum: int) -> list[tuple[Sequence[Batch], int]]:
    out = []
    for start in range(0, len(batches), accum):
        window = batches[start : start + accum]
        out.append((window, sum(len(y) for _, y in window)))
    return out


def fabric_loop(
    model: nn.Module,
    batches: Sequence[Batch],
    epochs: int,
    accum: int,
    precision: str,
    device: torch.device,
) -> None:
    from lightning.fabric import Fabric

    fabric = Fabric(
        accelerator="cuda" if device.type == "cuda" else "cpu",
        devices=1,
        precision=_FABRIC_PRECISION[precision],  # type: ignore[arg-type]
    )
    model, optimizer = fabric.setup(model, _optimizer(model))
    loss_fn = nn.CrossEntropyLoss()
    windows = _windows(batches, accum)
    model.train()
    for _ in range(epochs):
        for window, window_samples in windows:
            for x, y in window:
                loss = loss_fn(model(x), y) * (len(y) / window_samples)
                fabric.backward(loss)
            fabric.clip_gradients(model, optimizer, max_norm=1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def accelerate_loop(
    model: nn.Module,
    batches: Sequence[Batch],
    epochs: int,
    accum: int,
    precision: str,
    device: torch.device,
) -> None:
    from accelerate import Accelerator  # type: ignore[import-untyped, unused-ignore]
    from accelerate.state import (  # type: ignore[import-untyped, unused-ignore]
        AcceleratorState,
        GradientState,
    )

    # Accelerate keeps its state in process-wide singletons and refuses a second Accelerator
    # with another precision (the GPU suite runs bf16 GPT-2, then the fp32 MLP). Clearing
    # them (what its own tests do) makes each round build Accelerate afresh, as a new
    # process would, the way each round builds Fabric and core afresh.
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(
        cpu=device.type != "cuda", mixed_precision=_ACCELERATE_PRECISION[precision]
    )
    model, optimizer = accelerator.prepare(model, _optimizer(model))
    loss_fn = nn.CrossEntropyLoss()
    windows = _windows(batches, accum)
    model.train()
    for _ in range(epochs):
        for window, window_samples in windows:
            for x, y in window:
                loss = loss_fn(model(x), y) * (len(y) / window_samples)
                accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


PEERS: dict[str, Peer] = {
    "fabric": Peer("fabric", "Fabric", "lightning.fabric", fabric_loop),
    "accelerate": Peer("accelerate", "Accelerate", "accelerate", accelerate_loop),
}


def quiet() -> None:
    """Keep the peers' start-up banners and hints out of the benchmark's table."""
    for name in ("lightning", "lightning.fabric", "lightning_fabric", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"(lightning|lightning_fabric|accelerate)(\.|$)")
