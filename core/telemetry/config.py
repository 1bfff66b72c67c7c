"""The logging section of the config tree."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.checks import check_bool_fields, is_int, is_number
from core.errors import config_error
from core.flat_keyword import flat

__all__ = ("LoggingConfig", "check_profile_steps")

_ALLOWED_STEPS = "None (off) or a tuple of three integers (wait >= 0, warmup >= 0, active >= 1)"
_FIX_STEPS = "profile_steps=(1, 1, 3) skips one step, warms up on one and records three."


def check_profile_steps(value: object) -> tuple[int, int, int] | None:
    """The ``profile_steps`` setting as ``(wait, warmup, active)``, or None when off."""
    if value is None:
        return None
    if not (isinstance(value, (tuple, list)) and len(value) == 3 and all(map(is_int, value))):
        raise config_error("profile_steps", value, _ALLOWED_STEPS, _FIX_STEPS)
    wait, warmup, active = value
    if wait < 0 or warmup < 0 or active < 1:
        raise config_error("profile_steps", value, _ALLOWED_STEPS, _FIX_STEPS)
    return (wait, warmup, active)


@dataclass(frozen=True, kw_only=True)
class LoggingConfig:
    """Records reach ``events.jsonl`` and ``events()`` every ``flush_interval_s`` seconds, at
    every epoch end and at the end of the run. A consumer of ``events()`` more than
    ``event_buffer_size`` records behind loses the oldest ones; training never waits.

    After the run, callbacks get ``callback_grace_s`` to finish (trackers upload there).
    ``progress``: on rank 0, a start banner, a progress bar per epoch (a plain line per epoch
    when stderr is not a terminal) and an end summary. ``reports``: at the end of a run,
    ``training_metrics.png`` (with matplotlib, ``pip install -e '.[plots]'``) and
    ``performance_summary.txt`` in the run directory, built from ``events.jsonl``.
    ``profile_steps=(wait, warmup, active)``: a torch.profiler trace of ``active`` steps after
    ``wait + warmup`` steps, written to ``<run_dir>/profile/``. ``step_accuracy``: each
    ``train_step`` record's ``accuracy`` where the targets are class indices, counted on the
    device and read back with the loss (False saves its few device ops per step)."""

    event_buffer_size: int = field(default=1024, metadata=flat("event_buffer_size"))
    flush_interval_s: float = field(default=0.25, metadata=flat("log_flush_interval_s"))
    callback_grace_s: float = field(default=10.0, metadata=flat("callback_grace_s"))
    progress: bool = field(default=True, metadata=flat("progress"))
    reports: bool = field(default=True, metadata=flat("reports"))
    profile_steps: tuple[int, int, int] | None = field(default=None, metadata=flat("profile_steps"))
    step_accuracy: bool = field(default=True, metadata=flat("step_accuracy"))

    def __post_init__(self) -> None:
        check_bool_fields(self)
        if self.profile_steps is not None:
            object.__setattr__(self, "profile_steps", check_profile_steps(self.profile_steps))
        if not (is_int(self.event_buffer_size) and self.event_buffer_size >= 1):
            raise config_error("event_buffer_size", self.event_buffer_size, "an integer >= 1")
        interval = self.flush_interval_s
        if not (is_number(interval) and 0 < interval <= 60):
            raise config_error("flush_interval_s", interval, "a number of seconds in (0, 60]")
        grace = self.callback_grace_s
        if not (is_number(grace) and 0 <= grace <= 3600):
            raise config_error("callback_grace_s", grace, "a number of seconds in [0, 3600]")
