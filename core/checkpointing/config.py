"""The checkpoint section of the config tree: where, when, what to keep, resuming."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from core.checks import check_bool_fields, is_int, is_path
from core.errors import config_error
from core.flat_keyword import flat

__all__ = ("CheckpointConfig", "METRIC_NAME")

_MODES = ("auto", "strict")
METRIC_NAME = re.compile(r"^(val|train)_[A-Za-z_][A-Za-z0-9_]*$")


def _optional_positive(value: object) -> bool:
    return value is None or (is_int(value) and value >= 1)


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where and when checkpoints are written, and whether a run resumes from one.

    ``checkpoint_dir=None`` means ``<log_dir>/<experiment_name>/checkpoints``, shared by the
    experiment's runs. ``resume``:

    - ``"auto"``: continue the newest lineage whose newest valid checkpoint is compatible
      (same model, optimizer and scheduler settings, data shape and seed) and unfinished
      (fewer epochs or steps than this run's ``max_epochs``/``max_steps``, not stopped
      early), passing over newer lineages it cannot continue (or cannot read, or that
      another live run holds: it branches from such a one only when none is left); when
      there is none, start a new run and say why in one line (a ``fresh_start`` record
      naming the differing settings). Re-running an edited script trains.
    - ``"strict"``: continue the newest lineage's newest valid checkpoint whatever it is: an
      incompatible or unreadable one is an :class:`~core.errors.IncompatibleCheckpointError`,
      one another live run holds a :class:`~core.errors.LineageHeldError`, a finished run
      stays finished. For services that must never silently start over.
    - the path of a checkpoint directory (strict, that one), or None to start fresh.

    Retention (``keep_last_n``, ``save_top_k``, ``save_last``) counts over the lineage (every
    run that continued it), so restarts never grow the checkpoints.

    ``save_best=True`` also keeps the checkpoint where ``monitor`` (``val_loss``,
    ``train_loss``, ``val_accuracy`` or ``val_<metric>``) was best (lowest with
    ``mode="min"``, highest with ``"max"``). ``save_top_k=k`` keeps the ``k`` best instead,
    and implies ``save_best`` (``-1``: every monitored checkpoint, ``0``: none, as in
    Lightning). ``save_last=True`` keeps a link ``<checkpoint_dir>/last`` to the newest
    committed checkpoint, a stable path for ``load_weights``.

    ``keep_last_n`` is how many of the newest checkpoints are kept besides the best ones,
    by default (None) 1 with ``save_top_k`` or ``save_best`` and 2 without
    (:attr:`keep_newest`). Without best checkpoints, 2: a crash while the newest is written
    still leaves one to resume. With them, what is kept is the ``k`` best by ``monitor``
    plus the newest one (Lightning's ``last``, counted once when it is itself one of the
    best), so ``save_top_k=2`` keeps at most 3 checkpoints. ``save_top_k=0`` keeps the newest
    only, so that a run can still resume. An integer ``n`` keeps the ``n`` newest, whatever
    else is kept.
    """

    checkpoint_dir: str | Path | None = field(default=None, metadata=flat("checkpoint_dir"))
    checkpoint_every_n_steps: int | None = field(
        default=None, metadata=flat("checkpoint_every_n_steps")
    )
    checkpoint_every_n_epochs: int | None = field(
        default=1, metadata=flat("checkpoint_every_n_epochs")
    )
    keep_last_n: int | None = field(default=None, metadata=flat("keep_last_n"))
    resume: str | Path | None = field(default=None, metadata=flat("resume"))
    save_on_cancel: bool = field(default=True, metadata=flat("save_on_cancel"))
    safe_globals: Sequence[Any] = field(default=(), metadata=flat("checkpoint_safe_globals"))
    save_best: bool = field(default=False, metadata=flat("save_best"))
    save_top_k: int | None = field(default=None, metadata=flat("save_top_k"))
    save_last: bool = field(default=False, metadata=flat("save_last"))
    monitor: str = field(default="val_loss", metadata=flat("monitor"))
    mode: Literal["min", "max"] = field(default="min", metadata=flat("mode"))

    def __post_init__(self) -> None:
        if not (isinstance(self.monitor, str) and METRIC_NAME.match(self.monitor)):
            raise config_error(
                "monitor",
                self.monitor,
                "'val_loss', 'train_loss', 'val_accuracy' or 'val_<name>' of a metric",
                "e.g. monitor='val_f1' for metrics={'f1': F1Score(num_classes=2)}.",
            )
        if self.mode not in ("min", "max"):
            raise config_error(
                "mode", self.mode, "'min' or 'max'", "mode='max' for accuracy-like metrics."
            )
        for name in ("checkpoint_every_n_steps", "checkpoint_every_n_epochs"):
            if not _optional_positive(getattr(self, name)):
                raise config_error(name, getattr(self, name), "None (never) or an integer >= 1")
        if self.save_top_k is not None and not (is_int(self.save_top_k) and self.save_top_k >= -1):
            raise config_error(
                "save_top_k",
                self.save_top_k,
                "None, -1 (all) or an integer >= 0",
                "e.g. save_top_k=3 keeps the three best checkpoints by monitor.",
            )
        if self.save_top_k == 0 and self.save_best:
            raise config_error(
                "save_top_k",
                0,
                "None, -1 or an integer >= 1 with save_best=True",
                "drop save_top_k (save_best keeps the best one) or save_best.",
            )
        if not _optional_positive(self.keep_last_n):
            raise config_error(
                "keep_last_n",
                self.keep_last_n,
                "None (the default rule) or an integer >= 1",
                "e.g. keep_last_n=3 keeps the three newest checkpoints besides the best ones.",
            )
        check_bool_fields(self)
        if self.checkpoint_dir is not None and not is_path(self.checkpoint_dir):
            raise config_error(
                "checkpoint_dir", self.checkpoint_dir, "None (next to the logs) or a directory path"
            )
        self._check_resume()

    @property
    def top_k(self) -> int:
        """How many best checkpoints are kept: 0 (none), k, or -1 (every monitored one)."""
        if self.save_top_k is not None:
            return self.save_top_k
        return 1 if self.save_best else 0

    @property
    def tracks_best(self) -> bool:
        """Whether ``monitor`` is watched for best checkpoints (``save_best``/``save_top_k``)."""
        return self.top_k != 0

    @property
    def keep_newest(self) -> int:
        """How many of the newest checkpoints are kept besides the best ones."""
        if self.keep_last_n is not None:
            return self.keep_last_n
        return 1 if self.save_best or self.save_top_k is not None else 2

    def describe(self) -> dict[str, Any]:
        """Every setting, and what the defaults resolved to."""
        settings = {f.name: getattr(self, f.name) for f in fields(self)}
        return settings | {"top_k": self.top_k, "keep_newest": self.keep_newest}

    def _check_resume(self) -> None:
        resume = self.resume
        allowed = "None, 'auto', 'strict' or the path of a checkpoint directory"
        if resume is None or resume in _MODES:
            return
        if not is_path(resume):
            raise config_error("resume", resume, allowed)
        if str(resume).lower() in _MODES:
            raise config_error(
                "resume", resume, allowed, f"write resume={str(resume).lower()!r} in lower case."
            )
        if not Path(resume).is_dir():
            raise config_error(
                "resume",
                resume,
                allowed,
                "no such directory; pass an existing checkpoint "
                "(a step-... directory) or resume='auto' for the newest one.",
            )
