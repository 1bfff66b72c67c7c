"""``load_model``: rebuild a model from a checkpoint alone, when its run was given a factory.
The factory (``model="package.module:function"`` or ``Factory(...)``) is in every manifest.

    model = core.load_model(results.best_checkpoint)       # no constructor call to repeat
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.checkpointing.manifest import MANIFEST, followed, read_verified
from core.checkpointing.weights import load_weights
from core.errors import CheckpointError
from core.factory import Factory

__all__ = ("load_model", "model_factory_of")


def model_factory_of(path: str | Path) -> Factory | None:
    """The factory ``path`` records for its model (None: its run was given an object)."""
    path = followed(Path(path))
    try:
        recorded = json.loads((path / MANIFEST).read_text()).get("model_factory")
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is not a checkpoint: cannot read its manifest ({exc})"
        ) from exc
    return None if recorded is None else Factory.from_dict(recorded)


def load_model(
    path: str | Path,
    *,
    device: str | torch.device | None = None,
    safe_globals: Sequence[Any] = (),
) -> nn.Module:
    """The model of checkpoint ``path``: built by its recorded factory (else a
    :class:`~core.errors.CheckpointError`), weights loaded (strict), in eval mode, on ``device``
    if given."""
    path = followed(Path(path))
    read_verified(path)
    factory = model_factory_of(path)
    if factory is None:
        raise CheckpointError(
            f"{path} does not record how its model was made: its run was given a model "
            "object; allowed: a checkpoint of a run given model='package.module:function' or "
            "model=core.Factory('package.module:function', **kwargs). Fix: build the model "
            "yourself and call core.load_weights(path, model)."
        )
    model = factory()
    if not isinstance(model, nn.Module):
        raise CheckpointError(
            f"{path}: its model factory {factory!r} returned {type(model).__name__}, not a "
            "torch.nn.Module. Fix: point the factory at a function that returns the model."
        )
    if device is not None:
        model.to(device)
    load_weights(path, model, safe_globals=safe_globals)
    return model.eval()
