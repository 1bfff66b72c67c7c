"""What "newest" means among the checkpoints of one directory, without the wall clock. Each
commit records a ``sequence`` (one more than the highest the directory held); ties and older
manifests without one fall back on step and ``committed_at_ns``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.checkpointing.manifest import MANIFEST

__all__ = ("Entry", "by_lineage", "manifest_of", "newest_first", "next_sequence", "read_entry")


@dataclass(frozen=True)
class Entry:
    """A committed checkpoint as its manifest reads (not verified)."""

    path: Path
    lineage: str | None
    run_id: str | None
    step: int
    sequence: int | None
    committed_at_ns: int

    @property
    def in_lineage(self) -> tuple[bool, int, int, int, str]:
        """Its place in its lineage (greater: newer)."""
        sequenced = self.sequence is not None
        return (sequenced, self.sequence or 0, self.step, self.committed_at_ns, self.path.name)

    @property
    def overall(self) -> tuple[bool, int, int, str]:
        """Its place among every checkpoint of the directory (greater: newer)."""
        sequenced = self.sequence is not None
        return (sequenced, self.sequence or 0, self.committed_at_ns, self.path.name)


def manifest_of(path: Path) -> dict[str, Any]:
    """The manifest of ``path`` as it reads (unverified), or {}."""
    with contextlib.suppress(OSError, ValueError):
        manifest = json.loads((path / MANIFEST).read_text())
        if isinstance(manifest, dict):
            return manifest
    return {}


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_entry(path: Path) -> Entry:
    """``path``'s entry; what it lacks orders first (an unreadable manifest: by its mtime)."""
    manifest = manifest_of(path)
    lineage = manifest.get("lineage", manifest.get("run_id"))  # before lineages: its run
    run_id = manifest.get("run_id")
    stamp = _integer(manifest.get("committed_at_ns"))
    if stamp is None:
        stamp = 0
        with contextlib.suppress(OSError):
            stamp = (path / MANIFEST).stat().st_mtime_ns
    return Entry(
        path=path,
        lineage=lineage if isinstance(lineage, str) else None,
        run_id=run_id if isinstance(run_id, str) else None,
        step=_integer(manifest.get("step")) or 0,
        sequence=_integer(manifest.get("sequence")),
        committed_at_ns=stamp,
    )


def next_sequence(entries: Iterable[Entry]) -> int:
    return 1 + max((entry.sequence or 0 for entry in entries), default=0)


def newest_first(entries: Iterable[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda entry: entry.overall, reverse=True)


def by_lineage(entries: Iterable[Entry]) -> list[list[Entry]]:
    """The entries by lineage, each newest first, the lineage committed to last first."""
    grouped: dict[str | None, list[Entry]] = {}
    for entry in entries:
        grouped.setdefault(entry.lineage, []).append(entry)
    groups = [sorted(group, key=lambda e: e.in_lineage, reverse=True) for group in grouped.values()]
    return sorted(groups, key=lambda group: max(e.overall for e in group), reverse=True)
