"""``Tracker``: the shared base of experiment trackers, a callback that feeds a backend.

The base turns the run's records into params, texts, scalar rows (x = the optimizer step;
``train/*``, ``val/*``, ``epoch/*``) and report files, and hands them to six backend methods a
subclass implements, run in order on the tracker's own thread. A failing backend is closed
(``_close("FAILED")``) and its error raised from the tracker's next hook; training goes on.

Example::

    class LossFile(Tracker):               # a tracker in a few lines
        def _open(self, run, run_start): self.file = open(run.run_dir / "losses.txt", "w")
        def _log_params(self, params): pass
        def _log_text(self, name, text): pass
        def _log_scalars(self, rows): self.file.writelines(f"{r}\\n" for r in rows)
        def _log_artifact(self, path): pass
        def _close(self, status): self.file.close()
"""

from __future__ import annotations

import contextlib
import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio
import structlog
from typing_extensions import override

from core.callbacks import Callback, Record, RunInfo
from core.checks import check_bool, is_int
from core.errors import ConfigError, config_error
from core.reports import PLOT_FILE, SUMMARY_FILE
from core.reports.apart import ReportsFailed, wait_for_reports
from core.trackers.convert import ParamValue, Scalar, flatten_params, model_summary_text, scalars_of
from core.trackers.worker import BackendThread

__all__ = ("Status", "TrackedRun", "Tracker", "TrackerUnavailableError", "check_names", "require")

Status = Literal["FINISHED", "FAILED", "KILLED"]
# A stopped run gives control back without waiting for its reports' writer: the files are
# in the run directory, not in the tracker.
_STOPPED = ("stopped", "cancelled", "abandoned")
_STATUS: dict[object, Status] = {
    "completed": "FINISHED",
    "stopped": "KILLED",
    "cancelled": "KILLED",
    "failed": "FAILED",
    "abandoned": "FAILED",
}
_FLUSH_AT = ("epoch_end", "run_end")
_log = structlog.get_logger("core")


class TrackerUnavailableError(ConfigError, ImportError):
    """Raised when a tracker is built but its backend package (an extra) is not installed."""


def require(package: str, tracker: str, extra: str = "trackers") -> None:
    """Raise :class:`TrackerUnavailableError` unless ``package`` can be imported (the check
    does not import it)."""
    if importlib.util.find_spec(package) is None:
        raise TrackerUnavailableError(
            f"{tracker} needs the {package!r} package, which is not installed. "
            f"Fix: pip install {package}, or pip install -e '.[{extra}]' in core's checkout."
        )


def check_names(**names: object) -> None:
    """Raise a ConfigError for the first value that is neither None nor a non-empty str."""
    for field, value in names.items():
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise config_error(field, value, "None (the default) or a non-empty str")


@dataclass(frozen=True)
class TrackedRun:
    """What a backend needs to know about the run it records."""

    run_id: str
    name: str  # run_id, or run_id-rank<N> when every rank tracks
    experiment: str
    log_dir: Path  # the run config's log_dir: the experiments' root
    run_dir: Path | None  # <log_dir>/<experiment>/<run_id>
    rank: int


class Tracker(Callback, ABC):
    """Base of experiment trackers: records in, backend calls out, on a thread of its own.

    ``rank_zero_only`` (default): only global rank 0 tracks; with False every rank does
    (each gets its own backend run, named ``<run_id>-rank<N>``). A tracker given to a second
    run starts afresh.
    """

    def __init__(self, *, flush_every: int = 200, rank_zero_only: bool = True) -> None:
        if not (is_int(flush_every) and flush_every >= 1):
            raise config_error(
                "flush_every",
                flush_every,
                "an integer >= 1 (records between writes)",
                "the default, flush_every=200, suits most runs.",
            )
        check_bool("rank_zero_only", rank_zero_only)
        self.flush_every = flush_every
        self.rank_zero_only = rank_zero_only
        self._thread: BackendThread | None = None
        self._clear()

    # -- what subclasses implement (called on the tracker's thread) --------------------

    @abstractmethod
    def _open(self, run: TrackedRun, run_start: Record) -> None:
        """Open the backend, once, with the ``run_start`` record (``{}`` if it was lost)."""

    @abstractmethod
    def _log_params(self, params: dict[str, ParamValue]) -> None:
        """Log the hyper-parameters, once, as dotted keys (``run.max_epochs``)."""

    @abstractmethod
    def _log_text(self, name: str, text: str) -> None:
        """Log a text (Markdown) under ``name`` (the model summary, ``model_summary``)."""

    @abstractmethod
    def _log_scalars(self, rows: list[Scalar]) -> None:
        """Log a batch of scalar rows (every ``flush_every`` records, each epoch end, the end)."""

    @abstractmethod
    def _log_artifact(self, path: Path) -> None:
        """Log a report file of the run, once the run's files are complete."""

    @abstractmethod
    def _close(self, status: Status) -> None:
        """Flush and release the backend, last; ``status`` is how the run ended (``"KILLED"``
        also when cancelled as the run's callback grace runs out, before ``run_end``)."""

    # -- the callback hooks -----------------------------------------------------------

    @override
    async def on_record(self, run: RunInfo, record: Record) -> None:
        """Buffer the record's scalars; write them every ``flush_every`` records."""
        if record.get("event") == "run_start" and self._thread is not None:
            if not self._done:  # the same tracker, given to a new run: close the old one
                self._abort(RuntimeError("a new run started"))
            self._thread = None
            self._clear()
        if not self._tracks(run):
            return
        try:
            await self._handle(run, record)
        except BaseException as exc:
            self._abort(exc)
            raise

    @override
    async def on_run_closed(self, run: RunInfo) -> None:
        """Write what is buffered, log the report files, close the backend and wait for it."""
        if not self._tracks(run) or self._thread is None:
            return
        self._done = True
        try:
            self._write()
            if run.run_dir is not None and self._ended not in _STOPPED:  # see _STOPPED
                self._thread.submit(self._log_reports, run.run_dir)
            await self._thread.finish(self._close, self._status or "FAILED")
        except BaseException as exc:
            self._abort(exc)
            raise

    # -- internals --------------------------------------------------------------------

    def _clear(self) -> None:
        self._rows: list[Scalar] = []
        self._unflushed = 0  # records with scalars since the last write
        self._status: Status | None = None  # from run_end
        self._ended: object = None  # run_end's own status
        self._done = False

    def _tracks(self, run: RunInfo) -> bool:
        return not self._done and (run.is_global_zero or not self.rank_zero_only)

    async def _handle(self, run: RunInfo, record: Record) -> None:
        event = record.get("event")
        thread = self._thread or self._start(run, record if event == "run_start" else {})
        rows = scalars_of(record)
        if rows:
            self._rows.extend(rows)
            self._unflushed += 1
        if event == "run_end":
            self._ended = record.get("status")
            self._status = _STATUS.get(self._ended, "FAILED")
        if event in _FLUSH_AT or self._unflushed >= self.flush_every:
            self._write()
        await thread.settle(everything=event == "run_end")

    def _start(self, run: RunInfo, start: Record) -> BackendThread:
        thread = self._thread = BackendThread(type(self).__name__)
        thread.submit(self._open, self._tracked_run(run, start), start)
        thread.submit(self._log_params, _params(start))
        summary = model_summary_text(start.get("model_summary"))
        if summary is not None:
            thread.submit(self._log_text, "model_summary", summary)
        return thread

    def _tracked_run(self, run: RunInfo, start: Record) -> TrackedRun:
        settings = run.config.run
        run_id = start.get("run_id")
        if not isinstance(run_id, str):
            run_id = run.run_dir.name if run.run_dir is not None else "run"
        every_rank = not self.rank_zero_only and run.world_size > 1
        return TrackedRun(
            run_id=run_id,
            name=f"{run_id}-rank{run.rank}" if every_rank else run_id,
            experiment=settings.experiment_name,
            log_dir=Path(settings.log_dir),
            run_dir=run.run_dir,
            rank=run.rank,
        )

    def _write(self) -> None:
        if self._rows and self._thread is not None:
            self._thread.submit(self._log_scalars, self._rows)
            self._rows = []
        self._unflushed = 0

    def _log_reports(self, run_dir: Path) -> None:
        """On the tracker's thread: the report files the run wrote, once their writer ended."""
        with contextlib.suppress(ReportsFailed):  # said in the process's log; log what exists
            wait_for_reports(run_dir, timeout_s=None)
        for name in (PLOT_FILE, SUMMARY_FILE):
            if (run_dir / name).is_file():
                self._log_artifact(run_dir / name)

    def _abort(self, exc: BaseException) -> None:
        """A hook is leaving with an error or a cancellation: close the backend (queued)."""
        self._done = True
        if self._thread is None:
            return
        status: Status = "FAILED"
        if isinstance(exc, anyio.get_cancelled_exc_class()):  # the callback grace ran out
            status = self._status or "KILLED"
            _log.warning(
                "tracker_cancelled",
                tracker=type(self).__name__,
                backend_status=status,
                effect="the run's callback grace ran out: later records are not logged",
            )
        self._thread.close(self._close, status)


def _params(start: Record) -> dict[str, ParamValue]:
    """The hyper-parameters of ``run_start``: the config tree, the plan, the random seed."""
    params: dict[str, ParamValue] = {}
    for key, prefix in (("config", ""), ("plan", "plan.")):
        tree = start.get(key)
        if isinstance(tree, dict):
            params.update(flatten_params(tree, prefix))
    if is_int(seed := start.get("seed")):
        params["seed"] = seed
    return params
