"""A training process watched itself, whether or not the fork server that started it lives.
On Linux through a pidfd, with the service as child subreaper; elsewhere ``os.kill(pid, 0)``,
and the exit status of a process whose fork server died is reported as unknown.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

__all__ = ("ExitStatus", "WatchedProcess", "subreaper")

_PR_SET_CHILD_SUBREAPER = 36
_STATUS_WAIT_S = 2.0  # for the fork server to report an exit status, once the process ended
_REAP_POLL_S = 0.5


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: its exit code, or the signal that killed it (``None`` both when
    nobody could tell: its fork server died without reporting it)."""

    code: int | None
    signal_name: str | None

    @classmethod
    def of(cls, returncode: int) -> ExitStatus:
        if returncode < 0:
            return cls(None, signal.Signals(-returncode).name)
        return cls(returncode, None)

    @property
    def known(self) -> bool:
        return self.code is not None or self.signal_name is not None


class _Subreaper:
    """Counts the training processes running; the service is a child subreaper meanwhile."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None

    def acquire(self) -> None:
        with self._lock:
            self._users += 1
            if self._users == 1:
                self._set(1)

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._set(0)

    def _set(self, value: int) -> None:
        if self._libc is not None:
            self._libc.prctl(_PR_SET_CHILD_SUBREAPER, value, 0, 0, 0)


subreaper = _Subreaper()


class WatchedProcess:
    """A started training process, watched by its pid rather than through its fork server
    (were the fork server killed, ``multiprocessing`` would see it dead while it trains on)."""

    def __init__(self, process: BaseProcess) -> None:
        assert process.pid is not None, "watch a started process"
        self.process, self.pid = process, process.pid
        self._pidfd: int | None = None
        # A pidfd carries signals to this process, never to a later one that reused its pid.
        with contextlib.suppress(AttributeError, OSError):  # not Linux, or already gone
            self._pidfd = os.pidfd_open(self.pid)
        self._status: ExitStatus | None = None
        self._released = False

    def is_alive(self) -> bool:
        if self._status is not None:
            return False
        if self._pidfd is not None:
            return not select.select([self._pidfd], [], [], 0)[0]
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return self._reap() is None

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the process to exit; whether it has."""
        if self._pidfd is not None and self._status is None:
            select.select([self._pidfd], [], [], timeout)
            return self.is_alive() is False
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def send(self, signum: int) -> None:
        """Send ``signum`` to the process, if it still runs."""
        with contextlib.suppress(ProcessLookupError, OSError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signum)
            elif self.is_alive():
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send(signal.SIGKILL)

    def exit_status(self) -> ExitStatus:
        """How the process ended (call once it has: :meth:`join`)."""
        if self._status is None:
            self._status = self._reap() or self._reported()
        return self._status

    def release(self) -> None:
        """Let go of the process (idempotent; a worker thread's call): killed if it still runs,
        its pidfd closed, and what it left behind reaped."""
        if self._released:
            return
        self._released = True
        if not self.join(0):  # only a failure of its supervision leaves it running here
            self.kill()
            self.join()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        _Reaper(self.pid).start()
        self.process.join(_STATUS_WAIT_S)  # its fork server's report read: closable
        with contextlib.suppress(ValueError):  # a report that never came: left to the collector
            self.process.close()  # its status pipe, and multiprocessing's hold on its arguments

    def _reap(self) -> ExitStatus | None:
        """The status, where this process is now the parent (its fork server died)."""
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return None
        self._status = ExitStatus.of(os.waitstatus_to_exitcode(status))
        return self._status

    def _reported(self) -> ExitStatus:
        """The status the fork server reported; unknown where it died without one."""
        self.process.join(_STATUS_WAIT_S)
        code = self.process.exitcode
        if code is None or (code == 255 and not _fork_server_alive()):
            return ExitStatus(None, None)
        return ExitStatus.of(code)


def _fork_server_alive() -> bool:
    """Whether ``multiprocessing``'s fork server (this process's child, reaped by
    ``multiprocessing``) still runs."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:  # no such process, or no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


class _Reaper(threading.Thread):
    """Reaps the processes a training process left behind (its process group) until none is
    left."""

    def __init__(self, group: int) -> None:
        super().__init__(name="core-reaper", daemon=True)
        self._group = group

    def run(self) -> None:
        while True:
            try:
                os.waitpid(-self._group, 0)
                continue
            except ChildProcessError:
                pass
            try:
                os.killpg(self._group, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(_REAP_POLL_S)
