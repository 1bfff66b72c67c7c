"""Checkpoint directories that are either complete and verified, or ignored.

Layout: ``<checkpoint_dir>/step-000000123-<run_id>/`` holds ``state.pt`` (``torch.save``),
for FSDP2 a ``sharded/`` ``torch.distributed.checkpoint`` directory (its ``.metadata``
written last), and ``manifest.json`` (``core.checkpointing.manifest``: the run that wrote it,
the checkpoint it descends from, its commit time, every file's size and sha256). Writing
happens in a hidden staging directory next to it, unique to the writer
(``.step-000000123-<run_id>.staging-<host>-<pid>-<token>``); every file and the staging
directory are fsynced, then the staging directory is renamed into place and the parent
directory fsynced. The rename is the commit: a process killed at any earlier moment leaves
only a staging directory, which is never chosen and is swept once its writer is provably
gone (same host, process not alive).

Runs of one experiment share the directory and never touch each other's checkpoints: names
carry the run id, a run prunes only its own (the newest ``keep_last_n`` of them are kept),
and the newest checkpoint is the one committed last (commit order, not step number), so
``resume="auto"`` follows the latest lineage even after a resume from an older step.

Loading uses ``torch.load(weights_only=True)`` only, and a sharded checkpoint's
``.metadata`` is read through an allow-list first
(``core.checkpointing.dcp_metadata``): a file carrying
pickled code fails with :class:`~core.errors.UnsafeCheckpointError` before anything in it
runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import torch

from core.checkpointing.dcp_metadata import check_metadata
from core.checkpointing.manifest import MANIFEST, VERSION, file_entries, read_verified
from core.errors import CheckpointError, UnsafeCheckpointError

__all__ = ("CheckpointStore",)

STATE = "state.pt"
_COMMITTED = re.compile(r"^step-(\d{9})(?:-([A-Za-z0-9._-]+))?$")
_STAGING = re.compile(r"^\.step-\d{9}.*\.staging-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]+$")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_tag() -> str:
    """``<host>-<pid>-<token>``: who wrote a staging name (swept once that process is gone)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


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
    """Writes, lists, verifies, loads and prunes the checkpoints in one directory.

    ``run_id`` names the checkpoints this store writes and owns; ``parent`` is the name of
    the checkpoint the run resumed from (its lineage), recorded in each manifest.
    """

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
        self.parent: str | None = None
        self._synced: dict[Path, dict[str, Any]] = {}  # hashed and fsynced as written
        self.kept: set[str] = set()
        """Names of this run's checkpoints kept apart from ``keep_last_n`` (the best one)."""
        self.before_commit: Callable[[Path], None] | None = None
        """Test hook: called with the staging directory after every file is written and
        synced, right before the commit rename (fault-injection tests stall here)."""

    # -- writing --------------------------------------------------------------------------
    def final_path(self, step: int) -> Path:
        """Where this run's checkpoint of ``step`` is committed."""
        return self.directory / f"step-{step:09d}-{self.run_id}"

    def stage(self, step: int) -> Path:
        """A fresh, empty staging directory, unique to this writer, for ``step``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        staging = self.directory / f".{self.final_path(step).name}.staging-{_owner_tag()}"
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
        self, staging: Path, step: int, meta: dict[str, Any], *, replace: bool = False
    ) -> Path:
        """Hash, sync and atomically publish ``staging`` as this run's checkpoint of ``step``
        (``replace``: in place of this run's checkpoint of ``step``, if it has one)."""
        files = file_entries(staging, self._synced)
        for name in files:
            if staging / name not in self._synced:
                _fsync_path(staging / name)
        self._synced = {}
        manifest = {
            "manifest_version": VERSION, **meta, "step": step, "run_id": self.run_id,
            "parent": self.parent, "committed_at_ns": time.time_ns(), "files": files,
        }  # fmt: skip
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _fsync_path(staging / MANIFEST)
        directories = {(staging / name).parent for name in files} | {staging}
        for directory in sorted(directories, reverse=True):
            _fsync_path(directory)
        if self.before_commit is not None:
            self.before_commit(staging)
        final = self.final_path(step)
        replaced = None
        if final.exists():
            if not replace:
                raise CheckpointError(f"{final} already exists; a run never commits a step twice")
            # Out of sight first (a staging name: swept if we die here), then the new one in.
            replaced = final.with_name(f".{final.name}.staging-{_owner_tag()}")
            final.rename(replaced)
        staging.rename(final)
        _fsync_path(self.directory)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
        self.prune()
        return final

    def link_last(self, target: Path) -> None:
        """Point ``<directory>/last`` at ``target`` (a relative link, swapped atomically)."""
        link = self.directory / "last"
        temporary = self.directory / f".last.{_owner_tag()}"
        temporary.symlink_to(target.name, target_is_directory=True)
        temporary.replace(link)

    def discard(self, staging: Path) -> None:
        """Remove a staging directory after a failed write (best effort)."""
        shutil.rmtree(staging, ignore_errors=True)

    def prune(self) -> list[Path]:
        """Delete this run's committed checkpoints beyond its newest ``keep_last_n``, except
        those named in ``kept`` (the best one)."""
        mine = [p for p in self.committed() if self._owner(p) == self.run_id]
        removed = [p for p in mine[self.keep_last_n :] if p.name not in self.kept]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def sweep_staging(self) -> list[Path]:
        """Remove staging directories whose writer is provably gone: written on this host
        by a process that is no longer alive. Other writers' staging is left alone."""
        if not self.directory.exists():
            return []
        host = socket.gethostname()
        stale = []
        for path in self.directory.iterdir():
            match = _STAGING.match(path.name)
            if match and match["host"] == host and not _pid_alive(int(match["pid"])):
                stale.append(path)
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return stale

    # -- reading --------------------------------------------------------------------------
    @staticmethod
    def _owner(path: Path) -> str | None:
        match = _COMMITTED.match(path.name)
        return match[2] if match else None

    @staticmethod
    def _commit_time(path: Path) -> int:
        """When ``path`` was committed, by its manifest (unverified here), else its mtime."""
        manifest = path / MANIFEST
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            stamp = json.loads(manifest.read_text()).get("committed_at_ns")
            if isinstance(stamp, int):
                return stamp
        with contextlib.suppress(OSError):
            return manifest.stat().st_mtime_ns
        return 0

    def committed(self) -> list[Path]:
        """Committed checkpoint directories, the last committed first (not yet verified)."""
        if not self.directory.exists():
            return []
        found = [p for p in self.directory.iterdir() if _COMMITTED.match(p.name) and p.is_dir()]
        return sorted(found, key=lambda p: (self._commit_time(p), p.name), reverse=True)

    def verify(self, path: Path) -> dict[str, Any]:
        """The manifest of ``path`` once its schema, file list, sizes and hashes check out."""
        return read_verified(path)

    def newest_valid(self, on_invalid: Callable[[Path, str], None]) -> Path | None:
        """The last committed checkpoint that verifies; the others before it are reported."""
        for path in self.committed():
            try:
                self.verify(path)
            except CheckpointError as exc:
                on_invalid(path, str(exc))
                continue
            return path
        return None

    def load_state(self, path: Path) -> dict[str, Any]:
        """``state.pt`` of a checkpoint, unpickled with ``weights_only=True`` only, after its
        sharded ``.metadata`` (if any) passed the allow-list."""
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
