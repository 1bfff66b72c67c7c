"""``WandbLogger``: the run as a Weights & Biases run, offline unless wandb has credentials.
Offline runs go into ``<run_dir>/wandb/``; each run is its own
``wandb.init(reinit="create_new")``; the end maps to an exit code (FINISHED 0, FAILED 1, KILLED
255). Options and uploading: docs/logging-and-trackers.md. Needs ``wandb`` (the ``trackers``
extra).

Example::

    tracker = WandbLogger(project="bert", tags=["baseline"])   # offline without an API key
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from typing_extensions import override

from core.callbacks import Record
from core.checks import is_path
from core.errors import config_error
from core.trackers.base import Status, TrackedRun, Tracker, check_names, require
from core.trackers.convert import ParamValue, Scalar
from core.trackers.worker import import_lock

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

__all__ = ("WandbLogger",)

Mode = Literal["offline", "online", "disabled"]
_EXIT_CODES: dict[Status, int] = {"FINISHED": 0, "FAILED": 1, "KILLED": 255}
_NAMED = ("project", "name", "dir", "mode", "tags", "group", "entity", "config", "reinit")
_T = TypeVar("_T")


class _SharedService:
    """wandb's one service process, which the runs of a process share: started by the first
    ``wandb.init``, stopped here once the last run has finished (else it lives until the
    interpreter exits)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0

    def start(self, init: Callable[[], _T]) -> _T:
        """``init()`` (it opens one run), never while the service is being stopped."""
        with self._lock:
            started = init()
            self._open += 1
            return started

    def finished(self, wandb: ModuleType) -> None:
        """A run has finished: stop the service if no wandb run of the process is open (a
        program's own runs included)."""
        from wandb.sdk import wandb_setup

        with self._lock:  # wandb forgets a run when its finish starts, before its last write
            self._open -= 1
            if self._open or getattr(wandb_setup.singleton(), "_active_runs", None) != []:
                return  # a run is open, or this wandb keeps its runs elsewhere: leave it
            try:
                wandb.teardown()
            except SystemExit as exc:  # wandb exits the process when its service failed
                raise RuntimeError(f"wandb's service ended with exit code {exc.code}") from None


_SERVICE = _SharedService()


class WandbLogger(Tracker):
    """Logs the run to Weights & Biases; ``run_id`` is the wandb run's id once it is open,
    ``path`` its local directory (``.../wandb/offline-run-<time>-<id>``) and ``mode`` what
    it ran in (``"offline"``, ``"online"`` or ``"disabled"``).

    ``init_kwargs`` go to ``wandb.init`` as given (``notes``, ``job_type``, ``settings``).
    """

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        mode: Mode | None = None,
        *,
        tags: Sequence[str] = (),
        group: str | None = None,
        entity: str | None = None,
        init_kwargs: Mapping[str, Any] | None = None,
        flush_every: int = 200,
        rank_zero_only: bool = True,
    ) -> None:
        super().__init__(flush_every=flush_every, rank_zero_only=rank_zero_only)
        check_names(project=project, name=name, group=group, entity=entity)
        if dir is not None and not is_path(dir):
            raise config_error("dir", dir, "None (the run's directory) or a non-empty path")
        if mode is not None and mode not in get_args(Mode):
            raise config_error(
                "mode",
                mode,
                "None (offline unless wandb finds an API key), "
                + ", ".join(repr(m) for m in get_args(Mode)),
                "e.g. mode='offline'.",
            )
        if isinstance(tags, str) or not all(isinstance(t, str) and t for t in tags):
            raise config_error("tags", tags, "a list of non-empty str", "e.g. tags=['baseline'].")
        kwargs = dict(init_kwargs or {})
        if clash := [key for key in kwargs if key in _NAMED]:
            raise config_error(
                "init_kwargs",
                init_kwargs,
                f"wandb.init arguments other than {', '.join(_NAMED)}",
                f"pass {clash[0]} as WandbLogger's own argument.",
            )
        require("wandb", type(self).__name__)
        self.project, self.name, self.group, self.entity = project, name, group, entity
        self.dir = None if dir is None else Path(dir)
        self.requested_mode = mode
        self.tags = list(tags)
        self.init_kwargs = kwargs
        self.run_id: str | None = None  # of the current run, once open
        self.path: Path | None = None
        self.mode: Mode | None = None
        self._run: Run | None = None

    @override
    def _open(self, run: TrackedRun, run_start: Record) -> None:
        with import_lock:  # about half a second: on the tracker's thread
            import wandb

        directory = self.dir or run.run_dir or run.log_dir / run.experiment / run.run_id
        directory.mkdir(parents=True, exist_ok=True)
        every_rank = run.name != run.run_id  # each rank its own wandb run, grouped by run

        def init() -> tuple[Mode, Run]:
            mode = self.requested_mode or _auto_mode(wandb)
            return mode, wandb.init(
                project=self.project or run.experiment,
                name=self.name or run.name,
                dir=str(directory),
                mode=mode,
                tags=self.tags or None,
                group=self.group or (run.run_id if every_rank else None),
                entity=self.entity,
                config={
                    "core": {"run_id": run.run_id, "rank": run.rank, "run_dir": str(run.run_dir)}
                },
                reinit="create_new",
                **self.init_kwargs,
            )

        mode, created = _SERVICE.start(init)
        self._run, self.run_id, self.mode = created, created.id, mode
        self.path = None if mode == "disabled" else Path(created.dir).parent

    @override
    def _log_params(self, params: dict[str, ParamValue]) -> None:
        config = self._opened().config  # wandb's Config leaves its methods unannotated
        config.update(_nested(params), allow_val_change=True)  # type: ignore[no-untyped-call]

    @override
    def _log_text(self, name: str, text: str) -> None:
        if (files := self._files()) is not None:
            (files / f"{name}.md").write_text(text + "\n", encoding="utf-8")
            self._opened().save(str(files / f"{name}.md"), base_path=str(files), policy="now")

    @override
    def _log_scalars(self, rows: list[Scalar]) -> None:
        run = self._opened()
        for step, values in _by_step(rows):
            run.log(values, step=step)

    @override
    def _log_artifact(self, path: Path) -> None:
        if (files := self._files()) is not None:  # a copy: the offline run syncs on its own
            shutil.copy2(path, files / path.name)
            self._opened().save(str(files / path.name), base_path=str(files), policy="now")

    @override
    def _close(self, status: Status) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        import wandb

        try:
            run.summary["status"] = status
        finally:
            try:
                run.finish(exit_code=_EXIT_CODES[status])
            finally:
                _SERVICE.finished(wandb)

    def _opened(self) -> Run:
        if self._run is None:
            raise RuntimeError("WandbLogger was not opened")
        return self._run

    def _files(self) -> Path | None:
        """The run's files directory (uploaded with the run); None for a disabled run."""
        return None if self.path is None else Path(self._opened().dir)


def _auto_mode(wandb: ModuleType) -> Mode:
    """The mode wandb's own settings ask for, else online when wandb finds credentials
    locally (checked without a prompt or a network call), else offline."""
    configured = wandb.setup().settings.mode
    if configured in ("offline", "dryrun"):
        return "offline"
    if configured == "disabled":
        return "disabled"
    if wandb.run is not None:  # the program's own run: login() would not answer
        return "offline" if wandb.run.offline else "online"
    return "online" if wandb.login(prompt=False, verify=False) else "offline"


def _by_step(rows: list[Scalar]) -> list[tuple[int, dict[str, float]]]:
    """Consecutive rows of one optimizer step as one history row (with its ``epoch``)."""
    grouped: list[tuple[int, dict[str, float]]] = []
    for row in rows:
        if not grouped or grouped[-1][0] != row.step:
            grouped.append((row.step, {}))
        values = grouped[-1][1]
        values[row.name] = row.value
        if row.epoch is not None:
            values["epoch"] = row.epoch
    return grouped


def _nested(params: Mapping[str, ParamValue]) -> dict[str, Any]:
    """Dotted keys as nested dicts, the shape wandb's config shows as ``run.max_epochs``."""
    tree: dict[str, Any] = {}
    for key, value in params.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree
