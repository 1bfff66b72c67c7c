"""The storage a run on a cluster writes to must be the storage its service reads: a path
mounted on every node (NFS, a cloud file system, a Kubernetes volume), checked when the run
starts.

The service writes a marker with a fresh token into each directory the run writes
(``log_dir``, the checkpoint directory); the run's actor, wherever Ray placed it, must read
the same token there before anything trains. A directory it does not see is refused with
the path, the node and the fix; the marker is removed when the run ends.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

from core.config import TrainingConfig
from core.errors import ConfigError

__all__ = ("not_shared", "remove_markers", "write_markers")

_MARKER = ".core-shared-"


def write_markers(config: TrainingConfig) -> dict[str, str]:
    """``{marker path: token}`` for each directory the run writes (they exist: checked)."""
    token = uuid.uuid4().hex
    markers: dict[str, str] = {}
    for directory in (Path(config.run.log_dir), config.checkpoint_directory):
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / f"{_MARKER}{token}"
        marker.write_text(token)
        markers[str(marker)] = token
    return markers


def remove_markers(markers: dict[str, str]) -> None:
    for marker in markers:
        with contextlib.suppress(OSError):
            Path(marker).unlink()


def not_shared(missing: list[str], host: str) -> ConfigError:
    """The error of a run whose actor, on ``host``, did not see the ``missing`` markers."""
    directories = ", ".join(str(Path(marker).parent) for marker in missing)
    return ConfigError(
        f"run.log_dir / checkpoint.checkpoint_dir ({directories}) is not storage the run's "
        f"actor on node {host} sees as this service does (a file written here is not there); "
        "allowed: a path mounted on every node of the cluster (NFS, a cloud file system, a "
        "Kubernetes volume). Fix: point run.log_dir (and checkpoint.checkpoint_dir) at shared "
        "storage, e.g. log_dir='/mnt/shared/logs'."
    )
