"""The first profiler start of a process, without kineto's false alarm on stderr.

Started off the thread that imported torch (the step thread always is), kineto prints an
error about an init callback that is empty in torch: nothing is lost, so the line is dropped.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

__all__ = ("KINETO_NOISE", "quiet_first_start")

KINETO_NOISE = b"External init callback must run in same thread as registerClient"

_lock = threading.Lock()
_started = False


def _flush_stderr() -> None:
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.flush()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


@contextlib.contextmanager
def quiet_first_start() -> Iterator[None]:
    """Around a profiler start: the process's first one has kineto's false alarm removed."""
    global _started
    with _lock:
        first, _started = not _started, True
    try:
        saved = os.dup(2) if first else None
    except OSError:  # no stderr to filter
        saved = None
    if saved is None:
        yield
        return
    with tempfile.TemporaryFile() as capture:
        _flush_stderr()
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            _flush_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines = capture.read().splitlines(keepends=True)
            _write_all(2, b"".join(line for line in lines if KINETO_NOISE not in line))
