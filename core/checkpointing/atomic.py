"""The filesystem steps of a checkpoint commit, ordered so that a process killed between any two
of them leaves a valid newest checkpoint and nothing a later start cannot clean up. Leftovers
carry hidden names (``.<name>.staging|replaced|deleting-<owner>``, ``.last.<owner>``) that
:func:`sweep` cleans up; the protocol: docs/checkpoints-and-reliability.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from core.errors import CheckpointError

__all__ = (
    "exchange",
    "fsync_path",
    "hidden",
    "last_target",
    "link_last",
    "owner_tag",
    "publish",
    "retire",
    "sweep",
)

Hidden = Literal["staging", "replaced", "deleting"]
_HIDDEN = re.compile(
    r"^\.(?P<name>step-\d{9}(?:-[A-Za-z0-9._-]+?)?)\.(?P<kind>staging|replaced|deleting)"
    r"-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]+$"
)
_NEXT_LAST = re.compile(r"^\.last\.(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]+$")
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV}
LAST = "last"


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def owner_tag() -> str:
    """``<host>-<pid>-<token>``: who wrote a hidden name."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def hidden(final: Path, kind: Hidden) -> Path:
    """A fresh hidden name next to ``final`` for a directory in state ``kind``."""
    return final.with_name(f".{final.name}.{kind}-{owner_tag()}")


def _renameat2() -> Callable[..., int] | None:
    try:
        function: Callable[..., int] = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # a C library older than glibc 2.28
        return None
    return function


_RENAMEAT2 = _renameat2()


def exchange(first: Path, second: Path) -> bool:
    """Swap two directories in one atomic step; False where the file system cannot."""
    if _RENAMEAT2 is None:
        return False
    done = _RENAMEAT2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    if done == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


def publish(staging: Path, final: Path, *, replace: bool) -> None:
    """Make the synced ``staging`` directory the checkpoint ``final``; the rename is the commit."""
    directory = final.parent
    if not final.exists():
        staging.rename(final)
        fsync_path(directory)
        return
    if not replace:
        raise CheckpointError(f"{final} already exists; a run never commits a step twice")
    if exchange(staging, final):  # the old one now carries the staging name: swept if we die
        fsync_path(directory)
        shutil.rmtree(staging, ignore_errors=True)
        return
    aside = hidden(final, "replaced")  # put back by the next start if we die before the new
    final.rename(aside)
    staging.rename(final)
    fsync_path(directory)
    shutil.rmtree(aside, ignore_errors=True)


def retire(path: Path) -> None:
    """Delete a committed checkpoint: out of sight first (one rename), then its files."""
    aside = hidden(path, "deleting")
    try:
        path.rename(aside)
    except FileNotFoundError:  # another writer retired it first
        return
    shutil.rmtree(aside, ignore_errors=True)


def link_last(directory: Path, target: Path) -> None:
    """Point ``<directory>/last`` at ``target`` (a relative link, swapped atomically)."""
    temporary = directory / f".{LAST}.{owner_tag()}"
    temporary.symlink_to(target.name, target_is_directory=True)
    temporary.replace(directory / LAST)
    fsync_path(directory)  # durable before pruning may remove the checkpoint it named before


def last_target(directory: Path) -> str | None:
    """The name ``<directory>/last`` links to, if there is such a link."""
    with contextlib.suppress(OSError):
        return os.readlink(directory / LAST)
    return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is alive (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _gone(host: str, pid: str) -> bool:
    return host == socket.gethostname() and not pid_alive(int(pid))


def sweep(directory: Path) -> list[Path]:
    """Clean up the hidden names of dead writers of this host (a checkpoint set aside by an
    unfinished replace is put back, the rest removed); returns them."""
    if not directory.exists():
        return []
    handled = []
    for path in sorted(directory.iterdir()):
        if (match := _HIDDEN.match(path.name)) and _gone(match["host"], match["pid"]):
            final = directory / match["name"]
            if match["kind"] == "replaced" and not final.exists():
                path.rename(final)
                fsync_path(directory)
            else:
                shutil.rmtree(path, ignore_errors=True)
            handled.append(path)
        elif (match := _NEXT_LAST.match(path.name)) and _gone(match["host"], match["pid"]):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            handled.append(path)
    return handled
