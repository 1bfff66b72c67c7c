"""Checkpoint directories that are either complete and verified, or ignored.

``step-000000123-<run_id>/`` holds ``state.pt``, for FSDP2 ``sharded/``, and ``manifest.json``.
Lineages, retention and the commit protocol: docs/checkpoints-and-reliability.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import torch

from core.checkpointing import atomic
from core.checkpointing.atomic import fsync_path
from core.checkpointing.dcp_metadata import check_metadata
from core.checkpointing.lineage_lock import Holder, LineageLock, holder_of, sweep_locks
from core.checkpointing.manifest import (
    MANIFEST,
    VERSION,
    file_entries,
    other_version,
    read_verified,
)
from core.checkpointing.order import (
    Entry,
    by_lineage,
    manifest_of,
    newest_first,
    next_sequence,
    read_entry,
)
from core.errors import CheckpointError, UnsafeCheckpointError

__all__ = ("CheckpointStore",)

STATE = "state.pt"
_COMMITTED = re.compile(r"^step-(\d{9})(?:-([A-Za-z0-9._-]+))?$")


class _HashingWriter:
    """A file that hashes what ``torch.save`` writes through it (it writes sequentially)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle, self.digest, self.size = handle, hashlib.sha256(), 0

    def write(self, data: bytes | memoryview) -> int:
        self.digest.update(data)
        self.size += memoryview(data).nbytes
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


class CheckpointStore:
    """Writes, lists, verifies, loads and prunes the checkpoints in one directory."""

    def __init__(
        self,
        directory: Path,
        *,
        keep_last_n: int,
        safe_globals: Sequence[Any] = (),
        run_id: str | None = None,
    ) -> None:
        self.directory = directory
        self.keep_last_n = keep_last_n
        self.safe_globals = list(safe_globals)
        self.run_id = run_id or secrets.token_hex(3)
        self.lineage = self.run_id  # the run id of the run that began the lineage joined
        self.parent: str | None = None  # the checkpoint the run resumed from
        self._synced: dict[Path, dict[str, Any]] = {}  # hashed and fsynced as written
        self.kept: set[str] = set()  # the best checkpoints, kept apart from keep_last_n
        self._lock: LineageLock | None = None
        # Test hook: called with the synced staging directory right before the commit rename.
        self.before_commit: Callable[[Path], None] | None = None

    def begin(self, run_id: str) -> None:
        self.let_go()
        self.run_id = self.lineage = run_id
        self.parent = None
        self.kept = set()

    def hold(self) -> Holder | None:
        """Hold this store's lineage until :meth:`let_go`: None once held, else its holder."""
        if self._lock is not None and self._lock.lineage == self.lineage:
            return None
        self.let_go()
        self.directory.mkdir(parents=True, exist_ok=True)
        lock = LineageLock(self.directory, self.lineage)
        holder = lock.acquire(self.run_id)
        if holder is None:
            self._lock = lock
        return holder

    def held_by(self, path: Path) -> Holder | None:
        """The other live run that holds the lineage of ``path``, if any."""
        lineage = read_entry(path).lineage
        if lineage is None or (self._lock is not None and self._lock.lineage == lineage):
            return None
        return holder_of(self.directory, lineage)

    def let_go(self) -> None:
        """Release the lineage held, if any (never raises)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def continue_from(self, path: Path) -> tuple[str | None, Holder | None]:
        """After a resume from ``path``: join and hold its lineage if ``path`` is its newest
        valid checkpoint and no other run holds it: (None, None); else branch: (why, holder)."""
        self.parent = path.name
        resumed = read_entry(path)
        if resumed.lineage is None:
            return "its manifest names no lineage", None
        own, self.lineage = self.lineage, resumed.lineage
        holder = self.hold()
        if holder is not None:
            self.lineage = own
            return f"its lineage {resumed.lineage} is held by {holder.describe()}", holder
        newer = [
            entry.path
            for entry in self._entries()
            if entry.lineage == resumed.lineage and entry.in_lineage > resumed.in_lineage
        ]
        if any(self.verifies(other) for other in newer):
            self.let_go()
            self.lineage = own
            return "its lineage has newer checkpoints", None
        return None, None

    # -- writing --------------------------------------------------------------------------
    def final_path(self, step: int) -> Path:
        return self.directory / f"step-{step:09d}-{self.run_id}"

    def stage(self, step: int) -> Path:
        """A fresh staging directory, unique to this writer."""
        self.directory.mkdir(parents=True, exist_ok=True)
        staging = atomic.hidden(self.final_path(step), "staging")
        staging.mkdir()
        return staging

    def write_state(self, staging: Path, state: dict[str, Any]) -> None:
        """Write and fsync ``state.pt``, hashing it on the way (commit does not read it again)."""
        target = staging / STATE
        with target.open("wb") as handle:
            writer = _HashingWriter(handle)
            torch.save(state, cast(IO[bytes], writer))  # only write() is called
            handle.flush()
            os.fsync(handle.fileno())
        self._synced[target] = {"sha256": writer.digest.hexdigest(), "bytes": writer.size}

    def commit(
        self,
        staging: Path,
        step: int,
        meta: dict[str, Any],
        *,
        replace: bool = False,
        link_last: bool = False,
    ) -> Path:
        """Hash, sync and atomically publish ``staging`` as this run's checkpoint of ``step``,
        then point ``last`` at it, then prune; a kill between any two steps leaves a valid
        newest checkpoint (``core.checkpointing.atomic``)."""
        files = file_entries(staging, self._synced)
        for name in files:
            if staging / name not in self._synced:
                fsync_path(staging / name)
        self._synced = {}
        manifest = {
            "manifest_version": VERSION,
            **meta,
            "step": step,
            "run_id": self.run_id,
            "lineage": self.lineage,
            "parent": self.parent,
            "committed_at_ns": time.time_ns(),  # for people: the order is the sequence
            "sequence": next_sequence(self._entries()),
            "files": files,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        fsync_path(staging / MANIFEST)
        directories = {(staging / name).parent for name in files} | {staging}
        for directory in sorted(directories, reverse=True):
            fsync_path(directory)
        if self.before_commit is not None:
            self.before_commit(staging)
        final = self.final_path(step)
        atomic.publish(staging, final, replace=replace)
        if link_last and self._newer_than_last(final):
            atomic.link_last(self.directory, final)
        self.prune()
        return final

    def discard(self, staging: Path) -> None:
        """Remove a staging directory after a failed write (best effort)."""
        shutil.rmtree(staging, ignore_errors=True)

    def _newer_than_last(self, final: Path) -> bool:
        """Whether ``final`` is as new as ``last``'s target (another lineage may have moved it)."""
        target = atomic.last_target(self.directory)
        if target is None or not (self.directory / target).is_dir():
            return True
        return read_entry(self.directory / target).overall <= read_entry(final).overall

    def prune(self) -> list[Path]:
        """Delete the lineage's checkpoints beyond its newest ``keep_last_n``, except the
        ``kept`` ones and ``last``'s target."""
        lineages = by_lineage(self._entries())
        ours = next((group for group in lineages if group[0].lineage == self.lineage), [])
        spared = self.kept | {atomic.last_target(self.directory)}
        removed = [e.path for e in ours[self.keep_last_n :] if e.path.name not in spared]
        for path in removed:
            atomic.retire(path)
        return removed

    def sweep(self) -> list[Path]:
        """Clean up what killed writers left, and lock files no one holds."""
        swept = atomic.sweep(self.directory)
        return swept + (sweep_locks(self.directory) if self.directory.exists() else [])

    # -- reading --------------------------------------------------------------------------
    @classmethod
    def lineage_of(cls, path: Path) -> str | None:
        """The lineage of ``path`` by its manifest (before lineages: its run)."""
        return read_entry(path).lineage

    def verifies(self, path: Path, on_invalid: Callable[[Path, str], None] | None = None) -> bool:
        """Whether ``path`` verifies; ``on_invalid`` hears why not."""
        try:
            self.verify(path)
        except CheckpointError as exc:
            if on_invalid is not None:
                on_invalid(path, str(exc))
            return False
        return True

    def _entries(self) -> list[Entry]:
        if not self.directory.exists():
            return []
        return [
            read_entry(path)
            for path in self.directory.iterdir()
            if _COMMITTED.match(path.name) and path.is_dir()
        ]

    def committed(self) -> list[Path]:
        """Committed checkpoint directories, the newest first (unverified)."""
        return [entry.path for entry in newest_first(self._entries())]

    def written_by(self, run_id: str) -> list[Path]:
        """The committed checkpoints run ``run_id`` wrote, the newest first (unverified)."""
        return [entry.path for entry in newest_first(self._entries()) if entry.run_id == run_id]

    def verify(self, path: Path) -> dict[str, Any]:
        """The manifest of ``path`` once its schema, files, sizes and hashes check out."""
        return read_verified(path)

    def newest_valid(self, on_invalid: Callable[[Path, str], None]) -> Path | None:
        """The last committed checkpoint that verifies; the others before it are reported."""
        return next((path for path in self.committed() if self.verifies(path, on_invalid)), None)

    def lineages(self) -> list[list[Path]]:
        """Committed checkpoints by lineage (unverified), newest lineage and newest first."""
        return [[entry.path for entry in group] for group in by_lineage(self._entries())]

    @staticmethod
    def other_version(path: Path) -> str | None:
        """Why this version of core does not read ``path``'s manifest version; else None."""
        return other_version(manifest_of(path))

    def recorded_fingerprint(self, path: Path) -> dict[str, Any] | None:
        """The settings fingerprint ``path``'s manifest records (unverified), if any."""
        recorded = manifest_of(path).get("fingerprint")
        return recorded if isinstance(recorded, dict) else None

    def load_state(self, path: Path) -> dict[str, Any]:
        """``state.pt``, loaded ``weights_only=True`` after ``sharded/.metadata`` passed the
        allow-list."""
        if path.is_dir():
            check_metadata(path / "sharded")
        file = path / STATE if path.is_dir() else path
        try:
            with torch.serialization.safe_globals(self.safe_globals):
                state: dict[str, Any] = torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpointError(
                f"refused to load {file}: it holds pickled code or types that are not "
                f"allow-listed, and nothing in it was run ({str(exc).splitlines()[0]}). Fix: "
                "load only checkpoints you wrote, or allow-list trusted types with "
                "CheckpointConfig(safe_globals=[...])."
            ) from None
        except (OSError, RuntimeError, EOFError) as exc:
            raise CheckpointError(f"cannot read checkpoint {file}: {exc}") from None
        return state
