"""What the service keeps on disk of its retrains: the checkpoints of the newest few and of
the model it serves; older ones are removed, so a service that retrains every minute does
not fill its disk.

Each retrain writes its checkpoints into a directory of its own,
``<log_dir>/<experiment>/checkpoints/retrain-<service>-<number>``, so removing a retrain is
removing one directory (and, when it trained in a child process, the copy of its final
weights in its run directory, already loaded by then). Run directories (records, config)
stay: they are the service's history and hold no weights.

Example::

    retention = Retention(Path("logs/email_pipeline/checkpoints"), keep=2)
    directory = retention.new_retrain(number=1)    # the run's CheckpointConfig.checkpoint_dir
    retention.ran_in(directory, run_dir)           # once run_start names the run's directory
    retention.prune(served_checkpoint)             # in a worker thread
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

__all__ = ("FINAL_WEIGHTS", "Retention")

FINAL_WEIGHTS = "final_weights"
"""The directory where a run trained in a child process leaves its final weights (in its run
directory), for the service to load; pruned with the retrain's checkpoints."""


class Retention:
    """The checkpoint directories of this service's retrains, oldest first; :meth:`prune`
    removes all but the newest ``keep`` and the one holding the served checkpoint."""

    def __init__(self, root: Path, keep: int) -> None:
        self.root = root
        self.keep = keep
        self._service = secrets.token_hex(3)  # a restarted service never reuses a directory
        self._retrains: list[tuple[Path, Path | None]] = []

    def new_retrain(self, number: int) -> Path:
        """The checkpoint directory of retrain ``number`` (created by the run)."""
        directory = self.root / f"retrain-{self._service}-{number:06d}"
        self._retrains.append((directory, None))
        return directory

    def ran_in(self, directory: Path, run_dir: str | Path) -> None:
        """The run directory of the retrain checkpointing into ``directory``."""
        self._retrains = [(d, Path(run_dir) if d == directory else r) for d, r in self._retrains]

    def kept(self) -> list[Path]:
        """The checkpoint directories of the retrains not pruned yet, oldest first."""
        return [directory for directory, _ in self._retrains]

    def prune(self, served_checkpoint: str | Path | None) -> list[Path]:
        """Remove the retrains older than the newest ``keep``, except the one the served
        model was loaded from; returns the checkpoint directories removed. Blocking."""
        served = Path(served_checkpoint).resolve() if served_checkpoint is not None else None
        old, newest = self._retrains[: -self.keep], self._retrains[-self.keep :]
        kept = [(d, r) for d, r in old if served is not None and served.is_relative_to(d.resolve())]
        removed = [(d, r) for d, r in old if (d, r) not in kept]
        for directory, run_dir in removed:
            shutil.rmtree(directory, ignore_errors=True)
            if run_dir is not None:
                shutil.rmtree(run_dir / FINAL_WEIGHTS, ignore_errors=True)
        self._retrains = kept + newest
        return [directory for directory, _ in removed]
