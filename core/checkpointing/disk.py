"""One message for every form of a failed checkpoint write. An ``OSError``, torch's errno-less
short-write ``RuntimeError``, or a distributed checkpoint's ``CheckpointException`` wrapping
either.
"""

from __future__ import annotations

import errno
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ("disk_error", "free_bytes", "is_write_failure")

_DISK_ERRORS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
# torch's writers when a write came up short (no errno): a full disk, in practice
_SHORT_WRITE = re.compile(
    r"unexpected pos \d+ vs \d+|file write failed|PytorchStreamWriter failed writing"
    r"|No space left on device"
)
_NEARLY_FULL = 2**20


def is_write_failure(exc: BaseException) -> bool:
    """An error a checkpoint write can end with (DCP's is a ``BaseException``, not imported)."""
    return isinstance(exc, (OSError, RuntimeError)) or (
        type(exc).__name__ == "CheckpointException"
        and type(exc).__module__.startswith("torch.distributed.checkpoint")
    )


def free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _causes(exc: BaseException, depth: int = 0) -> Iterator[BaseException]:
    """``exc``, what it wraps (per-rank failures of a distributed checkpoint) and its chain."""
    if depth > 8:
        return
    yield exc
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        for failure in failures.values():
            inner = failure[0] if isinstance(failure, tuple) and failure else failure
            if isinstance(inner, BaseException):
                yield from _causes(inner, depth + 1)
    for linked in (exc.__cause__, exc.__context__):
        if linked is not None:
            yield from _causes(linked, depth + 1)


def _reason(exc: BaseException, free_at_failure: int | None) -> str:
    causes = list(_causes(exc))
    for cause in causes:
        known = _DISK_ERRORS.get(getattr(cause, "errno", None) or -1)
        if known is not None:
            return known
    if any(_SHORT_WRITE.search(str(cause)) for cause in causes):
        return "the disk is full (the write came up short)"
    if free_at_failure is not None and free_at_failure < _NEARLY_FULL:
        return "the disk is full"
    return f"{type(exc).__name__}: {exc}"


def _mib(size: int | None) -> str:
    return "unknown" if size is None else f"{size / 2**20:.1f} MiB"


def disk_error(
    exc: BaseException,
    directory: Path,
    what: str,
    last_good: str | None,
    free_at_failure: int | None = None,
) -> str:
    """One sentence for a failed write: path, why, free space, the last good checkpoint."""
    free_now = free_bytes(directory)
    if free_at_failure is None or free_now is None or free_at_failure == free_now:
        space = f"{_mib(free_now)} free there"
    else:
        space = (
            f"{_mib(free_at_failure)} free there when the write failed, {_mib(free_now)} "
            "once its partial files were removed"
        )
    kept = f"the last good checkpoint is {last_good}" if last_good else "no checkpoint was saved"
    return f"cannot write {what} in {directory}: {_reason(exc, free_at_failure)} ({space}); {kept}"
