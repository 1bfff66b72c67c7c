"""A model's initial-weights hash, and the one the experiment's previous run recorded, so
that ``run_start`` can say whether two runs started from the same weights.

Example::

    digest = weights_hash(model)                        # before the first step
    previous_init_hash(run_dir.parent, run_id) == digest  # same start as the last run?
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

__all__ = ("previous_init_hash", "weights_hash")

_EVENTS = "events.jsonl"


def weights_hash(model: nn.Module) -> str:
    """The sha256 (hex) of every parameter and buffer of ``model``, in ``state_dict()``
    order: each entry's name, dtype, shape and the raw bytes of a contiguous CPU copy.

    Cost: it reads every weight once (a device-to-host copy and a hash, about 1 s per GB),
    so it is computed once, at the start of a run. Two models hash equal exactly when
    their state dicts hold the same names, dtypes, shapes and bits.

    >>> weights_hash(nn.Linear(2, 2)) == weights_hash(nn.Linear(2, 2))  # random inits
    False
    """
    digest = hashlib.sha256()
    for name, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor):  # extra state a module may keep
            digest.update(f"{name}|{value!r}\n".encode())
            continue
        tensor = value.detach()
        full_tensor = getattr(tensor, "full_tensor", None)
        if callable(full_tensor):  # a sharded DTensor (FSDP2): hash the whole weight
            tensor = full_tensor()
        # Host sync, once per run: the bytes must be on the CPU to be hashed.
        host = tensor.cpu().contiguous()
        digest.update(f"{name}|{host.dtype}|{list(host.shape)}\n".encode())
        if host.numel():
            digest.update(host.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _recorded_hash(run_dir: Path) -> str | None:
    """``model_init_hash`` of the ``run_start`` record (the first line) of a run, if any."""
    try:
        with (run_dir / _EVENTS).open(encoding="utf-8") as handle:
            first = handle.readline()
        record = json.loads(first)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("event") != "run_start":
        return None
    value = record.get("model_init_hash")
    return value if isinstance(value, str) and value else None


def previous_init_hash(experiment_dir: Path, current_run_id: str) -> str | None:
    """The ``model_init_hash`` of the newest other run under ``experiment_dir`` that
    recorded one (run directory names sort by start time); None when no run did.

    Runs written before the field existed, and unreadable logs, are skipped.

    >>> previous_init_hash(Path("no-such-experiment"), "20261122-031500.123-a1b2c3") is None
    True
    """
    try:
        runs = sorted(
            (p for p in experiment_dir.iterdir() if p.is_dir() and p.name != current_run_id),
            key=lambda p: p.name,
            reverse=True,
        )
    except OSError:
        return None
    for run_dir in runs:
        found = _recorded_hash(run_dir)
        if found is not None:
            return found
    return None
