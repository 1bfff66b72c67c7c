"""Which checkpoint ``resume="auto"`` continues: the newest lineage it can, saying why it
passed over each newer one.

A lineage whose manifest already records other settings is passed over on that record
alone: none of its files is hashed or loaded, so the lineages of edited scripts cost a
manifest read each, whatever the model's size. The others are verified, newest first, and
the first valid checkpoint's state decides (its settings again, the model, finished). A
lineage nothing of which this version of core can read (no member verifies: another
manifest version, damaged files; or a state that does not load) is passed over as
``"unreadable"``, with the reason.

>>> from pathlib import Path
>>> lineages = [[Path("step-000000009-b")], [Path("step-000000020-a")]]
>>> recorded = {"step-000000009-b": "batch_size differs", "step-000000020-a": None}
>>> chosen, _, passed = choose(
...     lineages, lambda path: recorded[path.name], lambda path: None,
...     lambda path: {}, lambda state: None,
... )
>>> chosen.name, passed[0]["detail"]
('step-000000020-a', 'batch_size differs')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.errors import CheckpointError, UnsafeCheckpointError

__all__ = ("Passed", "choose")

Passed = list[dict[str, str]]
"""The checkpoints passed over: ``{"path", "reason", "detail"}`` each, the newest first."""


def choose(
    lineages: Sequence[Sequence[Path]],
    differs_on_record: Callable[[Path], str | None],
    invalid: Callable[[Path], str | None],
    read: Callable[[Path], dict[str, Any]],
    why_not: Callable[[dict[str, Any]], tuple[str, str] | None],
) -> tuple[Path | None, dict[str, Any] | None, Passed]:
    """The newest valid checkpoint of the first of ``lineages`` (the newest lineage first,
    each newest first) that neither ``differs_on_record`` (its manifest) nor ``why_not``
    (its state, as ``read``) has anything against; its state; and those passed over.
    ``invalid`` says why a checkpoint does not verify (None: it does)."""
    passed: Passed = []
    for members in lineages:
        detail = differs_on_record(members[0])
        if detail is not None:
            passed.append({"path": str(members[0]), "reason": "incompatible", "detail": detail})
            continue
        head, failures = None, []
        for path in members:
            if (failure := invalid(path)) is None:
                head = path
                break
            failures.append(failure)
        if head is None:
            passed.append({"path": str(members[0]), "reason": "unreadable", "detail": failures[0]})
            continue
        try:
            state = read(head)
        except UnsafeCheckpointError:  # pickled code: refused loudly, never passed over
            raise
        except CheckpointError as exc:  # its state.pt does not load
            passed.append({"path": str(head), "reason": "unreadable", "detail": str(exc)})
            continue
        why = why_not(state)
        if why is None:
            return head, state, passed
        passed.append({"path": str(head), "reason": why[0], "detail": why[1]})
    return None, None, passed
