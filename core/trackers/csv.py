"""``CSVLogger``: the run's scalars and hyper-parameters as CSV files (stdlib ``csv`` only).
``metrics.csv`` is in long format (``step,epoch,name,value``;
``pandas.read_csv(path).pivot_table(index="step", columns="name", values="value")`` makes it
wide), beside ``params.csv`` and ``model_summary.md``, in the run's directory or ``directory``
(report files copied there).
"""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path
from typing import IO

from typing_extensions import override

from core.callbacks import Record
from core.checks import is_path
from core.errors import config_error
from core.trackers.base import Status, TrackedRun, Tracker
from core.trackers.convert import ParamValue, Scalar

__all__ = ("CSVLogger",)


class CSVLogger(Tracker):
    """Writes ``metrics.csv`` and ``params.csv`` into ``directory`` (default: the run's
    directory; with several tracking ranks, file names end in ``-rank<N>``)."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        flush_every: int = 200,
        rank_zero_only: bool = True,
    ) -> None:
        super().__init__(flush_every=flush_every, rank_zero_only=rank_zero_only)
        if directory is not None and not is_path(directory):
            raise config_error(
                "directory",
                directory,
                "None (the run's directory) or a path",
                "e.g. CSVLogger(directory='metrics').",
            )
        self.directory = None if directory is None else Path(directory)
        self.path: Path | None = None  # metrics.csv, once the run opened it
        self._file: IO[str] | None = None
        self._writer: csv.DictWriter[str] | None = None
        self._suffix = ""

    @override
    def _open(self, run: TrackedRun, run_start: Record) -> None:
        default = run.run_dir or run.log_dir / run.experiment / run.run_id
        folder = self.directory or default
        folder.mkdir(parents=True, exist_ok=True)
        self._suffix = run.name[len(run.run_id) :]  # "" or "-rank<N>"
        self.path = folder / f"metrics{self._suffix}.csv"
        self._file = self.path.open("w", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, ("step", "epoch", "name", "value"))
        self._writer.writeheader()

    @override
    def _log_params(self, params: dict[str, ParamValue]) -> None:
        path = self._sibling(f"params{self._suffix}.csv")
        with path.open("w", newline="", encoding="utf-8") as file:
            writer = csv.writer(file)
            writer.writerow(("name", "value"))
            writer.writerows(params.items())

    @override
    def _log_text(self, name: str, text: str) -> None:
        self._sibling(f"{name}{self._suffix}.md").write_text(text + "\n", encoding="utf-8")

    @override
    def _log_scalars(self, rows: list[Scalar]) -> None:
        if self._writer is None or self._file is None:
            return
        self._writer.writerows(
            {"step": r.step, "epoch": r.epoch, "name": r.name, "value": r.value} for r in rows
        )
        self._file.flush()

    @override
    def _log_artifact(self, path: Path) -> None:
        target = self._sibling(path.name)
        if target.resolve() != path.resolve():
            shutil.copy2(path, target)

    @override
    def _close(self, status: Status) -> None:
        if self._file is not None:
            self._file.close()
            self._file = self._writer = None

    def _sibling(self, name: str) -> Path:
        if self.path is None:  # _open failed: nothing is written after a failure
            raise RuntimeError("CSVLogger was not opened")
        return self.path.with_name(name)
