"""Which checkpoint ``resume="auto"`` continues: the newest lineage it can, saying why it passed
over each newer one. Reasons: other settings, ``"held"`` by a live run, ``"unreadable"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.errors import CheckpointError, UnsafeCheckpointError

__all__ = ("Passed", "choose")

Passed = list[dict[str, str]]  # {"path", "reason", "detail"} each, the newest first


def choose(
    lineages: Sequence[Sequence[Path]],
    differs_on_record: Callable[[Path], str | None],
    invalid: Callable[[Path], str | None],
    read: Callable[[Path], dict[str, Any]],
    why_not: Callable[[dict[str, Any]], tuple[str, str] | None],
    held: Callable[[Path], str | None],
) -> tuple[Path | None, dict[str, Any] | None, Passed]:
    """The newest valid checkpoint of the first lineage (newest first) that none of
    ``differs_on_record``, ``held``, ``why_not`` objects to, else of the first held one
    ``why_not`` accepts; its state; and those passed over."""
    passed: Passed = []
    held_ones: list[Sequence[Path]] = []
    for members in lineages:
        # Passed over on its manifest's record alone: no file hashed or loaded, so an edited
        # script's old lineages cost a manifest read each, whatever the model's size.
        detail = differs_on_record(members[0])
        if detail is not None:
            passed.append({"path": str(members[0]), "reason": "incompatible", "detail": detail})
            continue
        holder = held(members[0])
        if holder is not None:
            passed.append({"path": str(members[0]), "reason": "held", "detail": holder})
            held_ones.append(members)
            continue
        head, state, why = _judge(members, invalid, read, why_not)
        if why is None:
            return head, state, passed
        passed.append(why)
    for members in held_ones:  # none free to continue: branch from the newest held one
        head, state, why = _judge(members, invalid, read, why_not)
        mine = next(i for i, entry in enumerate(passed) if entry["path"] == str(members[0]))
        if why is None:
            return head, state, passed[:mine] + passed[mine + 1 :]
        passed[mine] = why  # what keeps it from being continued at all
    return None, None, passed


def _judge(
    members: Sequence[Path],
    invalid: Callable[[Path], str | None],
    read: Callable[[Path], dict[str, Any]],
    why_not: Callable[[dict[str, Any]], tuple[str, str] | None],
) -> tuple[Path | None, dict[str, Any] | None, dict[str, str] | None]:
    """A lineage's newest valid checkpoint and its state, or why it is passed over."""
    failures = []
    for path in members:
        if (failure := invalid(path)) is None:
            break
        failures.append(failure)
    else:
        return None, None, {"path": str(members[0]), "reason": "unreadable", "detail": failures[0]}
    try:
        state = read(path)
    except UnsafeCheckpointError:  # pickled code: refused loudly, never passed over
        raise
    except CheckpointError as exc:  # its state.pt does not load
        return None, None, {"path": str(path), "reason": "unreadable", "detail": str(exc)}
    why = why_not(state)
    if why is not None:
        return None, None, {"path": str(path), "reason": why[0], "detail": why[1]}
    return path, state, None
