"""When to checkpoint, what a checkpoint holds, and how a run resumes from one.

Written only at optimizer-step boundaries (no accumulated gradient is saved); what it holds:
docs/checkpoints-and-reliability.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from torch import nn
from torch.optim import Optimizer

from core.checkpointing.choice import Passed, choose
from core.checkpointing.compatibility import (
    FORMAT,
    incompatibility,
    objection,
    recorded_difference,
    unreadable,
)
from core.checkpointing.config import CheckpointConfig
from core.checkpointing.disk import disk_error, free_bytes, is_write_failure
from core.checkpointing.manifest import followed
from core.checkpointing.store import CheckpointStore
from core.distributed import Strategy
from core.errors import (
    CheckpointError,
    IncompatibleCheckpointError,
    LineageHeldError,
    resume_advice,
    resume_fix,
)
from core.factory import Factory

__all__ = ("CheckpointConfig", "Checkpointer", "TrainerState")  # (the config re-exported)

_FREE_SPACE = "free space or point checkpoint_dir at a writable disk"

Emit = Callable[..., None]


class TrainerState(Protocol):
    """What the orchestrator hands the checkpointer: its non-tensor-heavy state."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def fingerprint(self) -> dict[str, Any]: ...

    def rng_at_epoch_start(self) -> dict[str, Any]: ...

    def rng_now(self) -> dict[str, Any]: ...

    def data_order(self) -> dict[str, Any]: ...

    def finished(self, trainer: dict[str, Any]) -> str | None: ...


class Checkpointer:
    """Saves and restores a run through a :class:`CheckpointStore`."""

    def __init__(
        self,
        config: CheckpointConfig,
        directory: Path,
        *,
        strategy: Strategy,
        model: nn.Module,
        optimizer: Optimizer,
        state: TrainerState,
        emit: Emit,
        report_error: Emit,
        model_factory: Factory | None = None,
    ) -> None:
        self.config = config
        self.store = CheckpointStore(
            directory, keep_last_n=config.keep_newest, safe_globals=config.safe_globals
        )
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.state = state
        self.emit = emit
        self.report_error = report_error
        self.model_factory = model_factory
        self.last_saved_step: int | None = None
        self.last_path: str | None = None  # the newest this run wrote or resumed from
        self.stale = False

    def describe(self) -> dict[str, Any]:
        return {**self.config.describe(), "directory": str(self.store.directory)}

    # -- when -----------------------------------------------------------------------------
    def due_after_step(self, global_step: int) -> bool:
        every = self.config.checkpoint_every_n_steps
        return every is not None and global_step % every == 0

    def due_after_epoch(self, epochs_completed: int) -> bool:
        every = self.config.checkpoint_every_n_epochs
        return every is not None and epochs_completed % every == 0

    # -- saving ---------------------------------------------------------------------------
    def begin_run(self, run_id: str) -> None:
        """Name this run's checkpoints after ``run_id`` (a lineage of its own until it
        resumes one); clean up what killed writers left."""
        self.store.begin(run_id)
        if self.strategy.is_global_zero:
            self.store.sweep()

    def end_run(self) -> None:
        self.store.let_go()

    def keep_best(self, paths: list[str]) -> None:
        """Keep ``paths`` as the run's best checkpoints; one that left them may be pruned."""
        self.store.kept = {Path(path).name for path in paths}
        if self.strategy.is_global_zero:
            self.store.prune()

    def mark_stale(self) -> None:
        """The state changed without a step: the next save at this step rewrites it in place."""
        self.stale = True

    def save(self, *, step: int, epoch: int, reason: str, best: bool = False) -> Path | None:
        """Write a checkpoint of the current state (a collective under DDP/FSDP2), or return
        this step's if it is not stale. A failed write leaves no partial files and raises
        :class:`~core.errors.CheckpointError` naming the free space and last good checkpoint."""
        fields = {"step": step, "epoch": epoch, "reason": reason}
        if self.last_saved_step == step and self.last_path is not None and not self.stale:
            if best:  # the checkpoint of this step is also the new best: say so
                self.emit("checkpoint", path=self.last_path, **fields, best=True, save_time_s=0.0)
            return Path(self.last_path)
        started = time.perf_counter()
        strategy = self.strategy
        rngs = strategy.gather_object(
            {"now": self.state.rng_now(), "epoch_start": self.state.rng_at_epoch_start()}
        )
        staging = Path(
            strategy.broadcast_object(str(self._stage(step)) if strategy.is_global_zero else "")
        )
        final: Path | None = None
        failure: str | None = None
        cause: BaseException | None = None
        try:
            strategy.save_sharded(self.model, self.optimizer, staging / "sharded")
            if strategy.is_global_zero:
                payload = {
                    "format": FORMAT,
                    "trainer": self.state.state_dict(),
                    "fingerprint": self.state.fingerprint(),
                    "rng": rngs,
                    **strategy.checkpoint_state(self.model, self.optimizer),
                }
                self.store.write_state(staging, payload)
                meta: dict[str, Any] = {
                    "epoch": epoch,
                    "reason": reason,
                    "fingerprint": payload["fingerprint"],
                }
                if self.model_factory is not None:  # core.load_model rebuilds the model
                    meta["model_factory"] = self.model_factory.to_dict()
                final = self.store.commit(
                    staging, step, meta, replace=True, link_last=self.config.save_last
                )
        except BaseException as exc:
            if not is_write_failure(exc):
                raise
            failure, cause = self._failed(exc, staging, step), exc
        # Rank 0 wrote alone: every rank learns how it went (none waits for a commit that
        # failed); a distributed checkpoint's failure is known to every rank already.
        outcome = strategy.broadcast_object((str(final) if final else None, failure))
        failure = failure or outcome[1]
        if failure is not None:
            raise CheckpointError(f"{failure}. {resume_fix(_FREE_SPACE)}") from cause
        final = Path(outcome[0] or staging)
        self.last_saved_step, self.last_path, self.stale = step, str(final), False
        seconds = time.perf_counter() - started
        self.emit("checkpoint", path=str(final), **fields, best=best, save_time_s=seconds)
        return final

    def _failed(self, exc: BaseException, staging: Path, step: int) -> str:
        free_at_failure = free_bytes(self.store.directory)
        self.store.discard(staging)
        what = f"the checkpoint of step {step}"
        return disk_error(exc, self.store.directory, what, self.last_path, free_at_failure)

    def _stage(self, step: int) -> Path:
        try:
            holder = self.store.hold()  # the lineage this run began, or holds already
            if holder is None:
                return self.store.stage(step)
        except OSError as exc:
            message = disk_error(exc, self.store.directory, "a checkpoint", self.last_path)
            raise CheckpointError(f"{message}. {resume_fix(_FREE_SPACE)}") from exc
        # Only a run of the same run id could hold a lineage this run began.
        raise CheckpointError(f"the lineage {self.store.lineage} is held by {holder.describe()}")

    # -- resuming -------------------------------------------------------------------------
    def restore(self) -> dict[str, Any] | None:
        """Resume as ``resume`` says (:class:`CheckpointConfig`): this rank's RNG states, or
        None to start a new run. ``"strict"`` and a path raise
        :class:`~core.errors.IncompatibleCheckpointError` where the checkpoint differs or is
        unreadable; ``"strict"`` raises :class:`~core.errors.LineageHeldError` on a held lineage."""
        target, payload, passed = self.config.resume, None, list[dict[str, str]]()
        if target is None:
            return None
        if str(target) == "auto":
            chosen, payload, passed = self._choose()
        elif str(target) == "strict":
            chosen = self._newest()
        else:
            chosen = followed(Path(target))
            if (other := self.store.other_version(chosen)) is not None:
                raise IncompatibleCheckpointError(_cannot_resume(chosen, other))
            self.store.verify(chosen)
        if chosen is None:
            return None
        return self._load(chosen, payload, passed, branch=str(target) != "strict")

    def _newest(self) -> Path | None:
        """The newest valid checkpoint; one of another manifest version is refused, not passed."""
        found, foreign = None, None
        if self.strategy.is_global_zero:
            for path in self.store.committed():
                if (other := self.store.other_version(path)) is not None:
                    foreign = _cannot_resume(path, other)
                    break
                if self.store.verifies(path, self._report_invalid):
                    found = path
                    break
        chosen, foreign = self.strategy.broadcast_object((str(found) if found else None, foreign))
        if foreign is not None:
            raise IncompatibleCheckpointError(foreign)
        return Path(chosen) if chosen else None

    def _choose(self) -> tuple[Path | None, dict[str, Any] | None, Passed]:
        """Rank 0 chooses (``core.checkpointing.choice``); every rank learns which."""
        found, payload, passed = None, None, list[dict[str, str]]()
        if self.strategy.is_global_zero:
            store, fingerprint = self.store, self.state.fingerprint()
            found, payload, passed = choose(
                store.lineages(),
                lambda path: recorded_difference(store.recorded_fingerprint(path), fingerprint),
                self._invalid,
                self.store.load_state,
                self._why_not,
                self._held,
            )
        chosen, passed = self.strategy.broadcast_object((str(found) if found else None, passed))
        if chosen is None and passed:
            self.emit("fresh_start", **passed[0], passed_over=passed)
        return (Path(chosen) if chosen else None), payload, passed

    def _why_not(self, payload: dict[str, Any]) -> tuple[str, str] | None:
        model, state = self.strategy.unwrap(self.model), self.state
        return objection(payload, state.fingerprint(), model.state_dict, state.finished)

    def _held(self, path: Path) -> str | None:
        holder = self.store.held_by(path)
        return None if holder is None else f"it is held by {holder.describe()}"

    def _invalid(self, path: Path) -> str | None:
        """Why ``path`` does not verify (also an ``error`` record); None: it does."""
        try:
            self.store.verify(path)
        except CheckpointError as exc:
            self._report_invalid(path, str(exc))
            return str(exc)
        return None

    def _read(self, path: Path) -> dict[str, Any]:
        payload = self.store.load_state(path)
        if (why := unreadable(payload)) is not None:
            raise IncompatibleCheckpointError(_cannot_resume(path, why))
        return payload

    def _report_invalid(self, path: Path, reason: str) -> None:
        self.report_error("error", kind="checkpoint_invalid", path=str(path), reason=reason)

    def _continue(self, path: Path, *, branch: bool) -> str | None:
        """Join ``path``'s lineage, or say why the run branches from it (on every rank); a
        held lineage raises :class:`~core.errors.LineageHeldError` unless it may ``branch``."""
        why, refusal = None, None
        if self.strategy.is_global_zero:
            why, holder = self.store.continue_from(path)
            if holder is not None and not branch:
                refusal = (
                    f"cannot continue {path}: {why}, which writes its checkpoints there now "
                    "(one writer per lineage). Fix: stop that run or wait for it to end, then "
                    f"resume; or resume with {resume_advice()}, which branches into a lineage "
                    "of its own."
                )
        why, refusal = self.strategy.broadcast_object((why, refusal))
        if refusal is not None:
            raise LineageHeldError(refusal)
        return why

    def _load(
        self, path: Path, payload: dict[str, Any] | None, passed: Passed, *, branch: bool
    ) -> dict[str, Any]:
        """Restore model, optimizer and trainer state from ``path``; this rank's RNG states.
        Raises :class:`~core.errors.IncompatibleCheckpointError` where it differs."""
        payload, model = payload or self._read(path), self.strategy.unwrap(self.model)
        differ = incompatibility(payload, self.state.fingerprint(), model.state_dict)
        if differ is not None:
            raise IncompatibleCheckpointError(
                f"cannot resume from {path}: {differ}. Fix: restore those settings, or start "
                f"a new run ({resume_advice()} starts one when they differ, no resume always "
                "does; or another experiment_name/checkpoint_dir)."
            )
        branched = self._continue(path, branch=branch)  # before the state: a refusal loads none
        self.strategy.load_checkpoint_state(self.model, self.optimizer, payload, path / "sharded")
        self.state.load_state_dict(payload["trainer"])
        self.last_saved_step = payload["trainer"]["global_step"]
        self.last_path = str(path)
        self.emit(
            "resumed",
            path=str(path),
            step=self.last_saved_step,
            epoch=payload["trainer"]["epoch"],
            lineage=self.store.lineage,
            branched=branched is not None,
            branch_reason=branched,
            passed_over=passed,
            **self.state.data_order(),
        )
        rngs, rank = payload["rng"], self.strategy.rank
        mine: dict[str, Any] = rngs[rank] if rank < len(rngs) else rngs[0]
        return mine


def _cannot_resume(path: Path, why: str) -> str:
    return (
        f"cannot resume from {path}: {why}. Fix: resume it with the version of core that wrote "
        f"it, or start a new run ({resume_advice()} passes it over; or another "
        "experiment_name/checkpoint_dir)."
    )
