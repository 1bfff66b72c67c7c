"""Checkpoint directories that are either complete and verified, or ignored.

Layout: ``<checkpoint_dir>/step-000000123/`` holds ``state.pt`` (``torch.save``), for FSDP2 a
``sharded/`` ``torch.distributed.checkpoint`` directory (its ``.metadata`` written last), and
``manifest.json`` with the sha256 of every file. Writing happens in a hidden staging
directory next to it (``.step-000000123.staging-<pid>``); every file and the staging
directory are fsynced, then the staging directory is renamed into place and the parent
directory fsynced. The rename is the commit: a process killed at any earlier moment leaves
only a staging directory, which is never chosen and is swept on the next start. Older
checkpoints are pruned only after the new one is committed.

Loading uses ``torch.load(weights_only=True)`` only: a file carrying pickled code fails with
:class:`~core.errors.UnsafeCheckpointError` before anything in it runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from core.errors import CheckpointError, UnsafeCheckpointError

__all__ = ("CheckpointStore",)

MANIFEST = "manifest.json"
STATE = "state.pt"
_COMMITTED = re.compile(r"^step-(\d{9})$")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            yield path


class CheckpointStore:
    """Writes, lists, verifies, loads and prunes the checkpoints in one directory."""

    def __init__(
        self, directory: Path, *, keep_last_n: int, safe_globals: Sequence[Any] = ()
    ) -> None:
        self.directory = directory
        self.keep_last_n = keep_last_n
        self.safe_globals = list(safe_globals)
        self.before_commit: Callable[[Path], None] | None = None
        """Test hook: called with the staging directory after every file is written and
        synced, right before the commit rename (fault-injection tests stall here)."""

    # -- writing --------------------------------------------------------------------------
    def final_path(self, step: int) -> Path:
        return self.directory / f"step-{step:09d}"

    def stage(self, step: int) -> Path:
        """A fresh, empty staging directory for the checkpoint of ``step``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        staging = self.directory / f".step-{step:09d}.staging-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        return staging

    @staticmethod
    def write_state(staging: Path, state: dict[str, Any]) -> None:
        target = staging / STATE
        with target.open("wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())

    def commit(self, staging: Path, step: int, meta: dict[str, Any]) -> Path:
        """Hash, sync and atomically publish ``staging`` as the checkpoint of ``step``."""
        files = {str(p.relative_to(staging)): _sha256(p) for p in _files(staging)}
        for path in _files(staging):
            _fsync_path(path)
        manifest = staging / MANIFEST
        manifest.write_text(json.dumps({**meta, "step": step, "files": files}, indent=2))
        _fsync_path(manifest)
        for directory in sorted({p.parent for p in _files(staging)} | {staging}, reverse=True):
            _fsync_path(directory)
        if self.before_commit is not None:
            self.before_commit(staging)
        final = self.final_path(step)
        if final.exists():  # the same step saved twice (epoch end and step interval)
            shutil.rmtree(staging)
            return final
        staging.rename(final)
        _fsync_path(self.directory)
        self.prune()
        return final

    def prune(self) -> list[Path]:
        """Delete committed checkpoints beyond the newest ``keep_last_n``."""
        removed = self.committed()[self.keep_last_n :]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def sweep_staging(self) -> list[Path]:
        """Remove staging directories left by killed writers (call before writing starts)."""
        if not self.directory.exists():
            return []
        stale = [p for p in self.directory.iterdir() if p.is_dir() and ".staging-" in p.name]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return stale

    # -- reading --------------------------------------------------------------------------
    def committed(self) -> list[Path]:
        """Committed checkpoint directories, newest step first (not yet verified)."""
        if not self.directory.exists():
            return []
        found = [p for p in self.directory.iterdir() if _COMMITTED.match(p.name) and p.is_dir()]
        return sorted(found, key=lambda p: p.name, reverse=True)

    def verify(self, path: Path) -> dict[str, Any]:
        """The manifest of ``path`` after checking every file's sha256; raises if any differs."""
        manifest_path = path / MANIFEST
        try:
            manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {path} has no readable manifest: {exc}") from None
        for name, expected in manifest["files"].items():
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"checkpoint {path} is missing {name}")
            actual = _sha256(file)
            if actual != expected:
                raise CheckpointError(
                    f"checkpoint {path}: {name} has sha256 {actual[:12]}..., the manifest "
                    f"says {expected[:12]}... (truncated or altered)"
                )
        return manifest

    def newest_valid(self, on_invalid: Callable[[Path, str], None]) -> Path | None:
        """The newest checkpoint whose files match its manifest; others are reported."""
        for path in self.committed():
            try:
                self.verify(path)
            except CheckpointError as exc:
                on_invalid(path, str(exc))
                continue
            return path
        return None

    def load_state(self, path: Path) -> dict[str, Any]:
        """``state.pt`` of a checkpoint, unpickled with ``weights_only=True`` only."""
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
