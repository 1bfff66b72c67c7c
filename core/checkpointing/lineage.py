"""The checkpoints of a run, as users see them: ``run.checkpoints``. A read-only view read from
the manifests each time it is asked (another run may commit meanwhile), the last committed
first: ``run.checkpoints.load(run.checkpoints.best, model)``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from torch import nn

from core.checkpointing.manifest import MANIFEST
from core.checkpointing.store import CheckpointStore
from core.checkpointing.weights import LoadedWeights, load_weights
from core.errors import CheckpointError

__all__ = ("CheckpointInfo", "Checkpoints")


@dataclass(frozen=True)
class CheckpointInfo:
    """One committed checkpoint, from its manifest (not verified: see ``verify``)."""

    path: Path
    step: int
    epoch: int
    reason: str  # step, epoch, best, signal, cancel, stopped_by_peer, error
    run_id: str | None  # the run that wrote it
    parent: str | None  # the checkpoint (a name in the same directory) that run resumed from
    committed_at_ns: int  # by the wall clock of the host that wrote it: for people, not order
    best: bool  # the current run's best checkpoint
    lineage: str | None = None  # the lineage it belongs to (its retention is counted there)
    sequence: int | None = None  # its place in commit order (None: written before sequences)

    @property
    def name(self) -> str:
        return self.path.name


Target = CheckpointInfo | str | Path


class Checkpoints(Sequence[CheckpointInfo]):
    """The committed checkpoints of one directory, the last committed first."""

    def __init__(
        self,
        store: CheckpointStore,
        best: Callable[[], str | None],
        safe_globals: Sequence[Any] = (),
    ) -> None:
        self._store, self._best, self._safe_globals = store, best, safe_globals

    @property
    def directory(self) -> Path:
        return self._store.directory

    def _all(self) -> list[CheckpointInfo]:
        best = self._best()
        best_name = Path(best).name if best else None
        found = [_info(path, best_name) for path in self._store.committed()]
        return [info for info in found if info is not None]

    def __len__(self) -> int:
        return len(self._all())

    @overload
    def __getitem__(self, index: int) -> CheckpointInfo: ...
    @overload
    def __getitem__(self, index: slice) -> list[CheckpointInfo]: ...
    def __getitem__(self, index: int | slice) -> CheckpointInfo | list[CheckpointInfo]:
        return self._all()[index]

    def __iter__(self) -> Iterator[CheckpointInfo]:
        return iter(self._all())

    def __repr__(self) -> str:
        names = ", ".join(info.name for info in self._all())
        return f"Checkpoints({self.directory}: {names or 'none'})"

    @property
    def latest(self) -> CheckpointInfo | None:
        """The last committed checkpoint that verifies (what ``resume="strict"`` takes;
        ``"auto"`` may pass over its lineage for an older one it can continue)."""
        path = self._store.newest_valid(lambda path, why: None)
        return None if path is None else self._find(path)

    @property
    def best(self) -> CheckpointInfo | None:
        """The run's best checkpoint (``save_best``), if it has one and it still exists."""
        best = self._best()
        return None if best is None else self._find(Path(best))

    def verify(self, checkpoint: Target) -> CheckpointInfo:
        """``checkpoint`` once its files check out; else :class:`~core.errors.CheckpointError`."""
        info = self._find(_path(checkpoint))
        self._store.verify(info.path)
        return info

    def load(
        self, checkpoint: Target | None, model: nn.Module, *, strict: bool = True
    ) -> LoadedWeights:
        """:func:`core.load_weights` of ``checkpoint`` (default: ``latest``)."""
        target = self.latest if checkpoint is None else self._find(_path(checkpoint))
        if target is None:
            raise CheckpointError(f"no valid checkpoint in {self.directory} to load")
        return load_weights(target.path, model, strict=strict, safe_globals=self._safe_globals)

    def lineage(self, checkpoint: Target | None = None) -> list[CheckpointInfo]:
        """``checkpoint`` (default: ``latest``), then the one its run resumed from, and so on."""
        chain: list[CheckpointInfo] = []
        current = self.latest if checkpoint is None else self._find(_path(checkpoint))
        while current is not None and current not in chain:
            chain.append(current)
            parent = current.parent
            current = None
            if parent is not None and (self.directory / parent).is_dir():
                current = self._find(self.directory / parent)
        return chain

    def _find(self, path: Path) -> CheckpointInfo:
        name = path.name
        for info in self._all():
            if info.name == name and info.path.parent.resolve() == path.parent.resolve():
                return info
        raise CheckpointError(
            f"{path} is not a committed checkpoint of {self.directory}; allowed: one of "
            f"{[info.name for info in self._all()]}. Fix: pick one from run.checkpoints."
        )


def _path(checkpoint: Target) -> Path:
    return checkpoint.path if isinstance(checkpoint, CheckpointInfo) else Path(checkpoint)


def _info(path: Path, best_name: str | None) -> CheckpointInfo | None:
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        manifest = json.loads((path / MANIFEST).read_text())
        return CheckpointInfo(
            path=path,
            step=int(manifest["step"]),
            epoch=int(manifest["epoch"]),
            reason=str(manifest["reason"]),
            run_id=manifest.get("run_id"),
            parent=manifest.get("parent"),
            committed_at_ns=int(manifest["committed_at_ns"]),
            best=path.name == best_name,
            lineage=manifest.get("lineage", manifest.get("run_id")),
            sequence=int(manifest["sequence"]) if "sequence" in manifest else None,
        )
    return None  # an unreadable manifest: listed by nobody, refused by verify and resume
