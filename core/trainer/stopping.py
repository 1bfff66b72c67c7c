"""How a run stops: the stop checkpoint, an abandoned step thread, a hurried or forced stop.

Whatever ends a run (cancellation of any kind, a signal, a peer's stop, a failing step),
the orchestrator asks :meth:`Stopping.checkpoint` for a checkpoint at the step boundary
where the step thread stopped, and gets back the last good checkpoint either way. A failing
save is recorded, never raised (it must not hide why the run stopped), and a thread that
never reached its boundary (``core.trainer.step_thread``) is never saved from.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from core.checkpointing.checkpointer import Checkpointer
from core.trainer.step_thread import StepThread

__all__ = ("RunEnding", "Stopping")

Emit = Callable[..., None]


@dataclass
class RunEnding:
    """How a run is ending: its ``run_end`` status, the error, the stop signals received."""

    status: str = "failed"
    error: Exception | None = None
    signals: list[int] = field(default_factory=list)


class Stopping:
    """Writes the stop checkpoint and reports stops that cannot wait for one."""

    def __init__(
        self,
        *,
        checkpointer: Checkpointer,
        save: Callable[[str], str | None],
        global_step: Callable[[], int],
        grace_s: float,
        emit: Emit,
        error: Emit,
        close_log: Callable[[], None],
    ) -> None:
        self.checkpointer = checkpointer
        self._save = save
        self._global_step = global_step
        self.grace_s = grace_s
        self._emit = emit
        self._error = error
        self._close_log = close_log

    async def checkpoint(
        self, worker: StepThread, reason: str, *, always: bool = False
    ) -> str | None:
        """A checkpoint where the run stopped; returns the last good checkpoint (this one,
        or an older one when none could be written).

        Stops honour ``save_on_cancel``; a failure in a step (``always``) checkpoints the
        last completed step regardless."""
        if worker.abandoned:
            self._report_abandoned()
        elif self._global_step() > 0 and (always or self.checkpointer.config.save_on_cancel):
            with anyio.CancelScope(shield=True):
                try:
                    return await worker.call(self._save, reason)
                except Exception as exc:
                    self._error(
                        "error", kind="checkpoint_failed", reason=f"{type(exc).__name__}: {exc}",
                        last_checkpoint=self.checkpointer.last_path,
                    )  # fmt: skip
        return self.checkpointer.last_path

    def _report_abandoned(self) -> None:
        self._error(
            "step_thread_abandoned", stop_grace_s=self.grace_s,
            last_checkpoint=self.checkpointer.last_path, step=self._global_step(),
            reason="the step thread did not reach a step boundary within stop_grace_s (a hung "
            "loader or collective); it is left running as a daemon thread, and nothing it "
            "holds was saved",
        )  # fmt: skip

    def hurry(self, signum: int) -> None:
        """A second stop signal: acknowledged; the stop already goes straight to the boundary."""
        self._emit(
            "signal_received", signal=signal.Signals(signum).name, action="hurry",
            note="the stop skips the rest of the epoch and validation, and still writes the "
            "checkpoint at the step boundary; a third signal exits at once",
        )  # fmt: skip

    def force_exit(self, signum: int) -> None:
        """A third stop signal: leave now, saying where the last good checkpoint is."""
        name, last = signal.Signals(signum).name, self.checkpointer.last_path
        message = (
            f"core: forced exit by a third {name}; the stop checkpoint was not waited for. "
            f"Last good checkpoint: {last or 'none'}. Resume with resume='auto'.\n"
        )
        with contextlib.suppress(Exception):
            self._error("forced_exit", signal=name, last_checkpoint=last)
            self._close_log()
        os.write(2, message.encode())  # the log may be what hangs: the terminal gets it too
        os._exit(128 + signum)
