"""``TensorBoardLogger``: the run in TensorBoard, through ``torch.utils.tensorboard``. One event
file per run under ``<log_dir>/<name>/<run_id>``; scalars by optimizer step; the
hyper-parameters, model summary and performance summary as texts; ``training_metrics.png`` as an
image. Needs ``tensorboard`` (the ``trackers`` extra).

Example::

    callbacks=[TensorBoardLogger("runs")]   # then: tensorboard --logdir runs
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from core.callbacks import Record
from core.checks import is_path
from core.errors import config_error
from core.trackers.base import Status, TrackedRun, Tracker, require
from core.trackers.convert import ParamValue, Scalar, markdown_table
from core.trackers.worker import import_lock

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = ("TensorBoardLogger",)


class TensorBoardLogger(Tracker):
    """Writes a TensorBoard event file per run under ``<log_dir>/<name>/<run_id>``."""

    def __init__(
        self,
        log_dir: str | os.PathLike[str] = "runs",
        name: str | None = None,
        *,
        flush_every: int = 200,
        rank_zero_only: bool = True,
    ) -> None:
        super().__init__(flush_every=flush_every, rank_zero_only=rank_zero_only)
        if not is_path(log_dir):
            raise config_error("log_dir", log_dir, "a non-empty path", "e.g. log_dir='runs'.")
        if name is not None and not (isinstance(name, str) and name.strip()):
            raise config_error("name", name, "None (the experiment name) or a non-empty str")
        require("tensorboard", type(self).__name__)
        self.log_dir = Path(log_dir)
        self.name = name
        self.path: Path | None = None  # the run's event-file directory, once opened
        self._writer: SummaryWriter | None = None

    @override
    def _open(self, run: TrackedRun, run_start: Record) -> None:
        with import_lock:
            from torch.utils.tensorboard import SummaryWriter

        self.path = self.log_dir / (self.name or run.experiment) / run.name
        self._writer = SummaryWriter(log_dir=str(self.path))

    @override
    def _log_params(self, params: dict[str, ParamValue]) -> None:
        # One Markdown table in the Text tab, not add_hparams: that writes a sub-run per call
        # showing only the scalars logged with it.
        table = markdown_table(("name", "value"), sorted(params.items()))
        self._open_writer().add_text("hparams", table)

    @override
    def _log_text(self, name: str, text: str) -> None:
        self._open_writer().add_text(name, text)

    @override
    def _log_scalars(self, rows: list[Scalar]) -> None:
        writer = self._open_writer()
        for row in rows:
            writer.add_scalar(row.name, row.value, global_step=row.step, walltime=row.wall_time)
        writer.flush()

    @override
    def _log_artifact(self, path: Path) -> None:
        writer = self._open_writer()
        if path.suffix == ".txt":  # indented: Markdown keeps the layout of a text report
            text = path.read_text(encoding="utf-8", errors="replace")
            writer.add_text(path.stem, "\n".join("    " + line for line in text.splitlines()))
        elif path.suffix == ".png" and (image := _read_image(path)) is not None:
            writer.add_image(path.stem, image, dataformats="HWC")

    @override
    def _close(self, status: Status) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _open_writer(self) -> SummaryWriter:
        if self._writer is None:
            raise RuntimeError("TensorBoardLogger was not opened")
        return self._writer


def _read_image(path: Path) -> Any | None:
    """The PNG as an H x W x C array (Pillow, else matplotlib); None without either."""
    try:
        with import_lock:
            import numpy as np
            from PIL import Image
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
    except ImportError:
        pass
    try:
        with import_lock:
            import matplotlib.image
        return matplotlib.image.imread(path)
    except ImportError:
        return None
