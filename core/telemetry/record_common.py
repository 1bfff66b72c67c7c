"""The fields every run record starts with (``core.telemetry.records`` has the rest).

No ``from __future__ import annotations``: checks read annotations.
"""

import sys
from typing import Annotated, Literal

if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
else:  # Python 3.10: the backport (typing_extensions comes with torch)
    from typing_extensions import NotRequired, TypedDict

__all__ = ("Common", "Level", "NotRequired", "TypedDict")

Level = Literal["info", "warning", "error"]


class Common(TypedDict):
    """The fields every record starts with."""

    event: Annotated[str, "the record type: one of the names below"]
    ts: Annotated[str, "when the record was emitted: ISO 8601, UTC, microseconds"]
    level: Annotated[Level, "severity: error for failures, warning for trouble, else info"]
    run_id: Annotated[str, "the run, e.g. 20261122-031500.123-a1b2c3 (sorts by start time)"]
    rank: Annotated[int, "the process's rank (0 when training alone)"]
