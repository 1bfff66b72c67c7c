"""Capturing and restoring every random number generator a step touches.

States are plain tensors, ints, floats, strings and tuples, so a checkpoint holding them
loads with ``torch.load(weights_only=True)`` (NumPy's state array becomes a tensor).
"""

from __future__ import annotations

import random
from typing import Any, cast

import torch

__all__ = ("capture_rng", "restore_rng")


def capture_rng() -> dict[str, Any]:
    """Python's, NumPy's (when installed), torch's CPU and every CUDA device's state."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:
        return state
    numpy_state = cast(tuple[str, Any, int, int, float], np.random.get_state(legacy=True))
    kind, keys, pos, has_gauss, cached = numpy_state
    state["numpy"] = (
        str(kind),
        torch.from_numpy(keys.astype("int64")),
        int(pos),
        int(has_gauss),
        float(cached),
    )
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` returned."""
    random.setstate(_as_tuples(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            return
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))


def _as_tuples(value: Any) -> Any:
    """random.setstate wants tuples; a round trip through some serialisers yields lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(v) for v in value)
    return value
