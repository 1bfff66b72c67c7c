"""How a run stops: the stop checkpoint, an abandoned step thread, a hurried or forced stop."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

import anyio

from core.checkpointing.checkpointer import Checkpointer
from core.errors import resume_advice
from core.telemetry.run_log import CurrentLog
from core.trainer.running.step_thread import HURRY_S, StepThread

__all__ = ("Stopping",)


class Stopping:
    """Writes the stop checkpoint and reports stops that cannot wait for one."""

    def __init__(
        self,
        *,
        checkpointer: Checkpointer,
        save: Callable[[str], str | None],
        global_step: Callable[[], int],
        grace_s: float,
        log: CurrentLog,
    ) -> None:
        self.checkpointer = checkpointer
        self._save = save
        self._global_step = global_step
        self.grace_s = grace_s
        self._log = log

    async def checkpoint(
        self, worker: StepThread, reason: str, *, always: bool = False
    ) -> str | None:
        """A checkpoint at the step boundary where the run stopped (``save_on_cancel``, or
        ``always`` after a failed step); returns the last good checkpoint either way. A save
        that fails is recorded, never raised: it must not hide why the run stopped."""
        if worker.abandoned:  # it never reached its boundary: nothing to save from
            self._report_abandoned(worker)
            return self.checkpointer.last_path
        if worker.parked:
            self._report_parked(worker)
        if self._global_step() > 0 and (always or self.checkpointer.config.save_on_cancel):
            with anyio.CancelScope(shield=True):
                try:
                    return await worker.call(self._save, reason)
                except Exception as exc:
                    self._log.error(
                        "error",
                        kind="checkpoint_failed",
                        reason=f"{type(exc).__name__}: {exc}",
                        last_checkpoint=self.checkpointer.last_path,
                    )
        return self.checkpointer.last_path

    def _report_abandoned(self, worker: StepThread) -> None:
        in_data = worker.waited_for_data
        self._log.error(
            "step_thread_abandoned",
            stop_grace_s=self.grace_s,
            waited_s=round(worker.waited_s, 3),
            waiting_for="data" if in_data else "step",
            last_checkpoint=self.checkpointer.last_path,
            step=self._global_step(),
            reason=(
                "the step thread still waited for its train loader after stop_grace_s, and "
                "with several ranks it cannot be parked there (the stop vote and checkpoint "
                "are collectives)"
                if in_data
                else "the step thread did not reach a step boundary within stop_grace_s (a "
                "collective or a kernel that never returns)"
            )
            + "; it is left running as a daemon thread, and nothing it holds was saved",
        )

    def _report_parked(self, worker: StepThread) -> None:
        self._log.warning(
            "step_thread_parked",
            loader_grace_s=worker.loader_grace_s,
            waited_s=round(worker.waited_s, 3),
            step=self._global_step(),
            note="the train loader had not returned a batch; the step thread is parked at "
            "this step boundary (it never steps again, even if the loader returns) and the "
            "stop checkpoint is written from here",
        )

    def hurry(self, worker: StepThread, signum: int) -> None:
        """A second stop signal: the stop waits for the loader no longer, for a step ``HURRY_S``."""
        worker.hurry()
        self._log.emit(
            "signal_received",
            signal=signal.Signals(signum).name,
            action="hurry",
            note=f"the stop no longer waits for the loader and waits at most {HURRY_S:g} s "
            "more for a running step; it still writes the checkpoint at the step boundary "
            "when it gets one; a third signal exits at once",
        )

    def force_exit(self, signum: int) -> None:
        """A third stop signal: leave now, saying where the last good checkpoint is."""
        name, last = signal.Signals(signum).name, self.checkpointer.last_path
        message = (
            f"core: forced exit by a third {name}; the stop checkpoint was not waited for. "
            f"Last good checkpoint: {last or 'none'}. Resume with {resume_advice()}.\n"
        )
        with contextlib.suppress(Exception):
            self._log.error("forced_exit", signal=name, last_checkpoint=last)
            if self._log.log is not None:
                self._log.log.close()
        os.write(2, message.encode())  # the log may be what hangs: the terminal gets it too
        os._exit(128 + signum)
