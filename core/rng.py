"""Every random number generator a run touches: seeding them, capturing and restoring them.

States are plain tensors, ints, floats, strings and tuples, so a checkpoint holding them
loads with ``torch.load(weights_only=True)`` (NumPy's state array becomes a tensor).

Example::

    seed_everything(0, deterministic=True)   # before building the model and loaders
    state = capture_rng(); ...; restore_rng(state)
"""

from __future__ import annotations

import os
import random
from typing import Any, cast

import torch

from core.checks import check_bool, is_int
from core.errors import config_error

__all__ = ("capture_rng", "restore_rng", "seed_everything")

_CUBLAS_WORKSPACE = ":4096:8"


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    """Seed Python's, NumPy's (when installed) and torch's generators (CPU and every CUDA
    device) with ``seed``.

    ``deterministic=True`` also makes torch choose deterministic kernels
    (``torch.use_deterministic_algorithms(True)``: an op without one raises instead of
    silently varying), turns cuDNN's deterministic mode on and its autotuner off, and sets
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless the user set it: cuBLAS picks reduction
    orders per workspace, so deterministic CUDA matmuls need a fixed workspace (CUDA 10.2+),
    and torch raises on such a matmul without it. It must be set before cuBLAS's first
    call, so seed before building the model. This is a process-wide switch:
    ``deterministic=False`` leaves the current settings as they are.

    >>> seed_everything(0)
    >>> a = torch.randn(2); seed_everything(0); torch.equal(a, torch.randn(2))
    True
    """
    if not (is_int(seed) and seed >= 0):
        raise config_error(
            "seed",
            seed,
            "an integer >= 0 (or None to leave the generators alone)",
            "pass seed=0 (any non-negative integer) for a reproducible run.",
        )
    check_bool("deterministic", deterministic)
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device (lazily, if not initialised yet)
    try:
        import numpy as np
    except ImportError:  # NumPy is optional
        pass
    else:
        np.random.seed(seed % 2**32)
    if deterministic:
        # Written, not read: cuBLAS reads it when its first handle is created.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


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
