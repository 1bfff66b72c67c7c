"""What a training process that ended without a word left behind: why it ended, as far as
its exit status and its records tell, and the last good checkpoint of its own run (its
lineage and model, however many other runs share the checkpoint directory)."""

from __future__ import annotations

from pathlib import Path

from core.checkpointing.compatibility import finished
from core.checkpointing.store import CheckpointStore
from core.config import TrainingConfig
from core.errors import CheckpointError
from core.trainer.process.child import FINAL_WEIGHTS
from core.trainer.process.child_state import ChildState
from core.trainer.process.crossing import MAIN_NOT_GUARDED
from core.trainer.process.watch import ExitStatus

__all__ = ("last_good_checkpoint", "main_not_guarded", "why_it_ended")

_NEVER_STARTED = " before its run opened (its stderr says why)"
_KILLED_EARLY = (
    " before its run opened, while it built the model and data (the OOM killer sends SIGKILL"
    " when memory runs out: the kernel log, dmesg, says so)"
)
_STATUS_UNKNOWN = " (how is unknown: the fork server that reports it had died)"


def main_not_guarded(status: ExitStatus, *, opened: bool) -> bool:
    """Whether a child exited at once because its program, imported there, creates a run
    when imported (no main guard): nothing was trained, so there is no checkpoint to name."""
    return not opened and status.code == MAIN_NOT_GUARDED


def why_it_ended(status: ExitStatus, *, opened: bool) -> str:
    """Why a child ended without reporting how its run ended (``opened``: its run had
    opened its directory), to follow "the training process was killed by SIGKILL"."""
    if opened:
        return "" if status.known else _STATUS_UNKNOWN
    if status.signal_name is not None:
        return _KILLED_EARLY
    return _NEVER_STARTED if status.known else _STATUS_UNKNOWN


def last_good_checkpoint(
    config: TrainingConfig, state: ChildState
) -> tuple[str | None, str | None]:
    """The last good checkpoint of the process's own run (the newest it wrote that verifies,
    else the one it resumed from; never another run's), and why that run had finished (None
    where it had not). A hand-back that was cut short leaves no staging behind."""
    if state.run_dir is not None:
        final = CheckpointStore(state.run_dir / FINAL_WEIGHTS, keep_last_n=1)
        if final.directory.is_dir():
            final.sweep()
    store = CheckpointStore(config.checkpoint_directory, keep_last_n=1)
    run_id = state.own_run_id
    own = store.written_by(run_id) if run_id is not None else []
    if state.resumed_from is not None:
        own.append(Path(state.resumed_from))
    last = next((path for path in own if store.verifies(path)), None)
    if last is None:
        return None, None
    try:
        trainer = store.load_state(last).get("trainer")
    except CheckpointError:  # it verified, but its state does not load: no verdict
        return str(last), None
    if not isinstance(trainer, dict):
        return str(last), None
    run = config.run
    return str(last), finished(trainer, max_epochs=run.max_epochs, max_steps=run.max_steps)
