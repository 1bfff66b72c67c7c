"""A fingerprint of a model's initial weights, and the one the experiment's previous run
recorded, so that ``run_start`` can say whether two runs started from the same weights.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

__all__ = ("HASH_METHOD", "SAMPLES_PER_TENSOR", "previous_init_hash", "weights_hash")

_EVENTS = "events.jsonl"

# Sampled, never a full hash: that would read a 7B model's 14 GB through the host at every
# run. Any random init differs at every sampled value; values between samples are not seen.
SAMPLES_PER_TENSOR = 64
HASH_METHOD = (
    f"sampled-sha256/{SAMPLES_PER_TENSOR}: sha256 of every state_dict entry's name, dtype and "
    f"shape and of {SAMPLES_PER_TENSOR} evenly spaced values of each tensor (first and last "
    "included), gathered on the device, one host copy per device; sharded tensors (DTensor) "
    "contribute their local shard"
)


def _sampled(tensor: torch.Tensor) -> torch.Tensor:
    """Up to :data:`SAMPLES_PER_TENSOR` evenly spaced values, as raw bytes on the device."""
    count = tensor.numel()
    if tensor.ndim == 0:
        picked = tensor.reshape(1)
    else:
        k = min(SAMPLES_PER_TENSOR, count)
        positions = torch.arange(k, device=tensor.device, dtype=torch.int64)
        if k > 1:
            positions = positions * (count - 1) // (k - 1)
        # A contiguous tensor is indexed through a flat view: the same values as the
        # unravelled index, without its per-tensor Python work (the factory builds on the
        # caller's thread, an event loop's included).
        if tensor.is_contiguous():
            picked = tensor.view(-1)[positions]
        else:
            picked = tensor[torch.unravel_index(positions, tensor.shape)]
    return picked.contiguous().view(-1).view(torch.uint8)


def _entries(model: nn.Module) -> Iterator[tuple[str, object]]:
    for name, value in model.state_dict().items():
        if isinstance(value, torch.Tensor):
            tensor = value.detach()
            to_local = getattr(tensor, "to_local", None)
            if callable(to_local):  # a DTensor (FSDP2): this rank's shard, no collective
                tensor = to_local()
            yield name, tensor
        else:
            yield name, value  # extra state a module may keep


def weights_hash(model: nn.Module) -> str:
    """The sampled fingerprint (sha256, hex) of ``model``'s state (:data:`HASH_METHOD`); one
    host sync."""
    digest = hashlib.sha256()
    samples: dict[torch.device, list[torch.Tensor]] = {}
    for name, value in _entries(model):
        if not isinstance(value, torch.Tensor):
            digest.update(f"{name}|{value!r}\n".encode())
            continue
        digest.update(f"{name}|{value.dtype}|{list(value.shape)}\n".encode())
        if value.numel() and value.device.type != "meta":
            samples.setdefault(value.device, []).append(_sampled(value))
    for device in sorted(samples, key=str):
        # Host sync, once per device and run: the sampled bytes must be on the CPU to hash.
        host = torch.cat(samples[device]).cpu()
        digest.update(host.numpy().tobytes())
    return digest.hexdigest()


def _recorded_hash(run_dir: Path) -> tuple[str, str | None] | None:
    """``model_init_hash`` and its method, from a run's first (``run_start``) record."""
    try:
        with (run_dir / _EVENTS).open(encoding="utf-8") as handle:
            first = handle.readline()
        record = json.loads(first)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("event") != "run_start":
        return None
    value = record.get("model_init_hash")
    method = record.get("model_init_hash_method")
    if not (isinstance(value, str) and value):
        return None
    return value, method if isinstance(method, str) else None


def previous_init_hash(
    experiment_dir: Path, current_run_id: str, method: str = HASH_METHOD
) -> str | None:
    """The ``model_init_hash`` of the newest other run under ``experiment_dir`` that recorded
    one computed by ``method``; None when no run did."""
    try:
        others = [p for p in experiment_dir.iterdir() if p.is_dir() and p.name != current_run_id]
    except OSError:
        return None
    runs = sorted(others, key=lambda p: p.name, reverse=True)  # run ids sort by start time
    for run_dir in runs:
        found = _recorded_hash(run_dir)
        if found is not None and found[1] == method:
            return found[0]
    return None
