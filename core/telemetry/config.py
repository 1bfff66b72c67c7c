"""The logging section of the config tree."""

from __future__ import annotations

from dataclasses import dataclass

from core.checks import is_int, is_number
from core.errors import config_error

__all__ = ("LoggingConfig",)


@dataclass(frozen=True, kw_only=True)
class LoggingConfig:
    """Records reach ``events.jsonl`` and ``events()`` every ``flush_interval_s`` seconds, at
    every epoch end and at the end of the run. A consumer of ``events()`` more than
    ``event_buffer_size`` records behind loses the oldest ones; training never waits."""

    event_buffer_size: int = 1024
    flush_interval_s: float = 0.25

    def __post_init__(self) -> None:
        if not (is_int(self.event_buffer_size) and self.event_buffer_size >= 1):
            raise config_error("event_buffer_size", self.event_buffer_size, "an integer >= 1")
        interval = self.flush_interval_s
        if not (is_number(interval) and 0 < interval <= 60):
            raise config_error("flush_interval_s", interval, "a number of seconds in (0, 60]")
