"""One writer per lineage: the advisory lock a run holds on the lineage it commits to. An
exclusive ``flock`` on ``.lineage-<lineage>.lock`` (released by the kernel when its process
dies), naming its holder; where it does not hold: docs/checkpoints-and-reliability.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from core.checkpointing.atomic import pid_alive

__all__ = ("Holder", "LineageLock", "holder_of", "sweep_locks")

_PREFIX, _SUFFIX = ".lineage-", ".lock"
_PLAIN = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")
_LOCK_FILE = re.compile(r"^\.lineage-.+\.lock$")
_ATTEMPTS = 20  # each 10 ms apart: a sweeper or a new holder holds a file that long at most
_PAUSE_S = 0.01


@dataclass(frozen=True)
class Holder:
    """Who holds a lineage, as its lock file says (None where it does not say yet)."""

    pid: int | None
    host: str | None
    run_id: str | None

    def describe(self) -> str:
        pid = "an unknown pid" if self.pid is None else f"pid {self.pid}"
        host = "an unknown host" if self.host is None else f"host {self.host}"
        return f"run {self.run_id or '(unknown)'} ({pid} on {host})"

    def is_gone(self) -> bool:
        """Whether the file names no one (a sweeper or a new holder not yet written) or a
        dead process of this host."""
        if self.pid is None or self.host is None:
            return True
        return self.host == socket.gethostname() and not pid_alive(self.pid)


# (real directory, lineage) -> holder, for this process: its own runs are told apart even
# where the file system's lock is per process.
_HELD: dict[tuple[str, str], Holder] = {}
_HELD_GUARD = threading.Lock()
_OPEN: set[int] = set()  # the descriptors of the locks held, closed in a forked child


def _forget_in_child() -> None:
    """In a forked child (a loader worker): the lock goes with the holder, not its children."""
    for fd in _OPEN:
        with contextlib.suppress(OSError):
            os.close(fd)
    _OPEN.clear()
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def lock_name(lineage: str) -> str:
    """The lock file's name (an untrusted lineage that is not a plain file name is hashed)."""
    plain = lineage if _PLAIN.match(lineage) else hashlib.sha256(lineage.encode()).hexdigest()
    return f"{_PREFIX}{plain}{_SUFFIX}"


def _read_holder(fd: int) -> Holder:
    with contextlib.suppress(OSError, ValueError):
        said = json.loads(os.pread(fd, 4096, 0) or b"{}")
        if isinstance(said, dict):
            pid, host, run_id = said.get("pid"), said.get("host"), said.get("run_id")
            return Holder(
                pid if isinstance(pid, int) else None,
                host if isinstance(host, str) else None,
                run_id if isinstance(run_id, str) else None,
            )
    return Holder(None, None, None)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file ``fd`` has open."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _try_lock(path: Path) -> tuple[int | None, Holder | None]:
    """The locked file's descriptor, or None and who holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            return None, holder
        except BaseException:
            os.close(fd)
            raise
        # A holder removes the file before letting go: a lock on a file no longer under that
        # name would be a second holder (the classic lock-file protocol).
        if _same_file(fd, path):
            return fd, None
        os.close(fd)  # removed by its last holder meanwhile: take the file there now


class LineageLock:
    """The lock of ``lineage`` in checkpoint ``directory`` (which must exist)."""

    def __init__(self, directory: Path, lineage: str) -> None:
        self.directory, self.lineage = directory, lineage
        self.path = directory / lock_name(lineage)
        self._fd: int | None = None

    def acquire(self, run_id: str) -> Holder | None:
        """Hold the lineage for run ``run_id``: None once held, else who holds it."""
        if self._fd is not None:
            return None
        key = (os.path.realpath(self.directory), self.lineage)
        with _HELD_GUARD:
            if key in _HELD:  # another run of this process
                return _HELD[key]
            holder: Holder | None = None
            for _ in range(_ATTEMPTS):
                fd, holder = _try_lock(self.path)
                if fd is not None:
                    self._take(fd, key, Holder(os.getpid(), socket.gethostname(), run_id))
                    return None
                assert holder is not None
                if not holder.is_gone():
                    return holder
                time.sleep(_PAUSE_S)
            return holder

    def _take(self, fd: int, key: tuple[str, str], me: Holder) -> None:
        try:
            said = json.dumps({"pid": me.pid, "host": me.host, "run_id": me.run_id}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, said, 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _OPEN.add(fd)
        _HELD[key] = me

    def release(self) -> None:
        """Let go of the lineage (the file removed first, while still held); never raises."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        finally:
            with _HELD_GUARD:
                _HELD.pop((os.path.realpath(self.directory), self.lineage), None)
                _OPEN.discard(fd)
            os.close(fd)  # the lock goes with the last descriptor of the file


def holder_of(directory: Path, lineage: str) -> Holder | None:
    """Who holds ``lineage`` now; None when no one does (it is not taken here)."""
    with _HELD_GUARD:
        if (held := _HELD.get((os.path.realpath(directory), lineage))) is not None:
            return held
    path, holder = directory / lock_name(lineage), None
    for _ in range(_ATTEMPTS):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            if not holder.is_gone():
                return holder
        else:
            return None  # free: closing lets go of this probe
        finally:
            os.close(fd)
        time.sleep(_PAUSE_S)
    return holder


def sweep_locks(directory: Path) -> list[Path]:
    """Remove the lock files no one holds (their holders died); returns them."""
    removed, real = [], os.path.realpath(directory)
    with _HELD_GUARD:  # this process's own (a POSIX lock would not keep it from them)
        ours = {lock_name(lineage) for where, lineage in _HELD if where == real}
    for path in sorted(directory.glob(f"{_PREFIX}*{_SUFFIX}")):
        if not _LOCK_FILE.match(path.name) or path.name in ours:
            continue
        fd, _ = _try_lock(path)
        if fd is None:
            continue
        try:
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
        finally:
            os.close(fd)
    return removed
