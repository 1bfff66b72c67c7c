"""Whether a run may continue a checkpoint: a state this version of core reads, the same
settings, the same model, unfinished.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = (
    "FORMAT",
    "differences",
    "finished",
    "incompatibility",
    "objection",
    "recorded_difference",
    "shape_difference",
    "unreadable",
)

FORMAT = 1  # of the state.pt this version of core writes and reads
_STATE_PARTS: dict[str, type] = {"trainer": dict, "fingerprint": dict, "rng": list}


def unreadable(payload: Mapping[str, Any]) -> str | None:
    """What keeps this version of core from resuming a checkpoint's state; None: it reads."""
    written = payload.get("format")
    if written != FORMAT:
        newer = isinstance(written, int) and written > FORMAT
        by = "a newer version of core" if newer else "another version of core or another program"
        return (
            f"its state has checkpoint format {written!r}, and this version of core reads "
            f"format {FORMAT} (it was written by {by})"
        )
    missing = [key for key, kind in _STATE_PARTS.items() if not isinstance(payload.get(key), kind)]
    if missing:
        return (
            f"its state.pt has no {' nor '.join(map(repr, missing))} (not written by a training "
            "run of core, or altered and its manifest rehashed)"
        )
    return None


def differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The fingerprint entries that differ, with both values. Entries only one side has
    (another optimizer's hyperparameters) are named only when no shared one differs."""
    differ = [key for key in sorted(set(saved) | set(now)) if saved.get(key) != now.get(key)]
    both = [key for key in differ if key in saved and key in now]
    shown = both or differ
    return [f"{key} (checkpoint {saved.get(key)!r}, now {now.get(key)!r})" for key in shown]


def recorded_difference(
    recorded: Mapping[str, Any] | None, fingerprint: Mapping[str, Any]
) -> str | None:
    """What differs from the fingerprint a manifest ``recorded``; None: agrees or absent."""
    if recorded is None:
        return None
    differ = differences(recorded, json.loads(json.dumps(fingerprint)))
    return f"the configuration differs in {', '.join(differ)}" if differ else None


def incompatibility(
    payload: Mapping[str, Any],
    fingerprint: Mapping[str, Any],
    model_state: Callable[[], Mapping[str, Any]],
) -> str | None:
    """What differs between ``payload`` and this run: settings, then (only if they agree)
    the model's shapes; else None."""
    differ = differences(payload["fingerprint"], fingerprint)
    if differ:
        return f"the configuration differs in {', '.join(differ)}"
    if isinstance(payload.get("model"), dict):
        return shape_difference(model_state(), payload["model"])
    return None


def objection(
    payload: Mapping[str, Any],
    fingerprint: Mapping[str, Any],
    model_state: Callable[[], Mapping[str, Any]],
    finished: Callable[[dict[str, Any]], str | None],
) -> tuple[str, str] | None:
    """Why ``resume="auto"`` leaves a checkpoint alone: ``(reason, detail)``; None: continue."""
    if (why := unreadable(payload)) is not None:
        return "unreadable", why
    differ = incompatibility(payload, fingerprint, model_state)
    if differ is not None:
        return "incompatible", differ
    ended = finished(payload["trainer"])
    return None if ended is None else ("finished", ended)


def shape_difference(current: Mapping[str, Any], saved: Mapping[str, Any]) -> str | None:
    """The first parameter or buffer whose name or shape differs, in words; else None."""
    for key in [*current, *(k for k in saved if k not in current)]:
        ours, theirs = current.get(key), saved.get(key)
        ours_shape = None if ours is None else tuple(ours.shape)
        theirs_shape = None if theirs is None else tuple(getattr(theirs, "shape", ()))
        if ours_shape != theirs_shape:
            saved_shape, now_shape = _shape(theirs_shape), _shape(ours_shape)
            return f"the model differs at {key!r} (checkpoint {saved_shape}, now {now_shape})"
    return None


def finished(trainer: Mapping[str, Any], *, max_epochs: int, max_steps: int | None) -> str | None:
    """Why a checkpoint's run has ended under this run's limits; None when it goes on."""
    epochs, steps = int(trainer["epoch"]), int(trainer["global_step"])
    if max_steps is not None and steps >= max_steps:
        return f"it reached max_steps ({steps} of {max_steps} optimizer steps)"
    if epochs >= max_epochs:
        return f"it completed max_epochs ({epochs} of {max_epochs} epochs)"
    if trainer.get("progress", {}).get("stopped_early"):
        return f"it stopped early after {epochs} epochs"
    return None


def _shape(shape: tuple[int, ...] | None) -> str:
    return "absent" if shape is None else f"shape {list(shape)}"
