"""Writing a run's reports in a child Python process, in the background: they never pause the
training process, never delay ``train()``'s return and never delay the process's exit. The child
has its own heap, GIL and session, runs at :data:`NICENESS` and loads ``core.reports`` alone."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from pathlib import Path

import structlog

from core.reports import REPORT_FILES, write_reports

__all__ = (
    "ERROR_FILE",
    "NICENESS",
    "ReportJob",
    "ReportsFailed",
    "start_reports",
    "wait_for_reports",
    "write_reports_apart",
)

_log = structlog.get_logger("core")

ERROR_FILE = "reports_error.txt"
"""Written into the run directory by a report writer that failed: its traceback."""
NICENESS = 19
"""The report writer's CPU priority, the lowest: below a training process (nice 10), so the
next training does not share its cores with the last one's figures. Its autogroup (Linux)
gets the same niceness: a nice value alone only counts within its group."""

# Loads the core.reports package from its directory without running core/__init__.py; a
# failure leaves its traceback next to the log (the parent may be gone by then).
_CHILD = """
import os, sys, traceback, types
from pathlib import Path
nice = max(os.getpriority(os.PRIO_PROCESS, 0), int(sys.argv[4]))
try:  # a session of its own is a scheduling group of its own (Linux's autogroup): set first,
    with open("/proc/self/autogroup", "w") as group:  # so that whoever sees the niceness set
        group.write(str(nice))  # finds the group's set too
except OSError:
    pass
os.setpriority(os.PRIO_PROCESS, 0, nice)
package = types.ModuleType("core")
package.__path__ = [sys.argv[1]]
sys.modules["core"] = package
run_dir = Path(sys.argv[2])
try:
    from core.reports import write_reports
    write_reports(run_dir)
except BaseException:
    (run_dir / sys.argv[3]).write_text(traceback.format_exc(), encoding="utf-8")
    raise SystemExit(1)
"""


class ReportsFailed(RuntimeError):
    """Raised by :meth:`ReportJob.wait` when the report writer failed (with its traceback)."""


class ReportJob:
    """One run's reports being written by a child process (or already written)."""

    def __init__(self, run_dir: Path, process: subprocess.Popen[bytes] | None) -> None:
        self.run_dir = run_dir
        self._process = process
        self._finished = threading.Event()
        self._error: str | None = None
        if process is None:
            self._finished.set()

    @classmethod
    def done(cls, run_dir: Path) -> ReportJob:
        """A job whose files were written already (in this process)."""
        return cls(run_dir, None)

    def _watch(self) -> None:
        """On a daemon thread: reap the child, and say in the process's log if it failed."""
        assert self._process is not None
        code = self._process.wait()
        if code != 0:
            error = self.run_dir / ERROR_FILE
            try:
                detail = error.read_text(encoding="utf-8").strip()[-2000:]
            except OSError:
                detail = f"the report writer exited with {code}"
            self._error = detail
            _log.warning("reports_failed", run_dir=str(self.run_dir), error=detail)
        self._finished.set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def files(self) -> list[Path]:
        """The report files present in the run directory now."""
        return [self.run_dir / name for name in REPORT_FILES if (self.run_dir / name).exists()]

    def wait(self, timeout_s: float | None = None) -> list[Path]:
        """Wait for the writer (at most ``timeout_s``); the files it wrote. Raises
        :class:`ReportsFailed` when it failed, ``TimeoutError`` when it is still writing."""
        if not self._finished.wait(timeout_s):
            raise TimeoutError(f"the reports of {self.run_dir} are still being written")
        if self._error is not None:
            raise ReportsFailed(f"the report writer of {self.run_dir} failed: {self._error}")
        return self.files()


_jobs: dict[Path, ReportJob] = {}
_jobs_lock = threading.Lock()
_plots_checked = False


def _warn_once_without_matplotlib() -> None:
    global _plots_checked  # noqa: PLW0603  (one warning per process)
    if not _plots_checked:
        _plots_checked = True
        if importlib.util.find_spec("matplotlib") is None:
            _log.warning(
                "plots_unavailable",
                reason="matplotlib is not installed",
                fix="pip install matplotlib (from a checkout: pip install -e '.[plots]')",
            )


def _spawn(run_dir: Path) -> subprocess.Popen[bytes]:
    package = Path(__file__).resolve().parent.parent
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(package), str(run_dir), ERROR_FILE, str(NICENESS)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives this process; not reached by its Ctrl-C
    )


def start_reports(run_dir: Path) -> ReportJob:
    """Start writing :func:`~core.reports.write_reports`'s files for ``run_dir`` in a child
    process and return at once. Where no child process can be started (an embedded
    interpreter without ``sys.executable``), the reports are written here instead."""
    run_dir = Path(run_dir)
    _warn_once_without_matplotlib()
    (run_dir / ERROR_FILE).unlink(missing_ok=True)
    try:
        process = _spawn(run_dir)
    except OSError as exc:
        _log.info("reports_in_process", reason=f"{type(exc).__name__}: {exc}")
        write_reports(run_dir)
        job = ReportJob.done(run_dir)
    else:
        job = ReportJob(run_dir, process)
        threading.Thread(target=job._watch, name="core-reports", daemon=True).start()
    with _jobs_lock:
        _jobs[run_dir] = job
    return job


def wait_for_reports(run_dir: Path | None = None, timeout_s: float | None = 60.0) -> list[Path]:
    """Wait until the reports this process started (of ``run_dir`` only, if given) are
    written, e.g. before uploading them (``train()`` returns while they are drawn); the files
    written. Raises :class:`ReportsFailed` for a writer that failed, ``TimeoutError`` after
    ``timeout_s``.

    >>> wait_for_reports(Path("logs/no-such-run"))
    []
    """
    with _jobs_lock:
        if run_dir is None:
            jobs = list(_jobs.values())
        else:
            job = _jobs.get(Path(run_dir))
            jobs = [] if job is None else [job]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    written: list[Path] = []
    for job in jobs:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        written += job.wait(left)
    return written


def write_reports_apart(run_dir: Path, *, timeout_s: float = 600.0) -> list[Path]:
    """:func:`start_reports` and wait for it: the files written (``ReportsFailed`` with the
    writer's traceback when it fails; ``TimeoutError`` after ``timeout_s``)."""
    return start_reports(run_dir).wait(timeout_s)
