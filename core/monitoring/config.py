"""The monitor section of the config tree."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from core.checks import check_bool_fields
from core.errors import config_error
from core.flat_keyword import flat

__all__ = ("GPUMonitorConfig",)


@dataclass(frozen=True, kw_only=True)
class GPUMonitorConfig:
    """``enabled``: sample during runs (off: no ``gpu_sample`` records, no NVML session).
    ``interval_s``: seconds between samples (0.1 is cheap: a sample costs microseconds).
    ``history_size``: samples kept in memory, oldest dropped first."""

    enabled: bool = True
    interval_s: float = field(default=1.0, metadata=flat("monitor_interval_s"))
    history_size: int = field(default=3600, metadata=flat("monitor_history_size"))

    def __post_init__(self) -> None:
        check_bool_fields(self)
        interval, size = self.interval_s, self.history_size
        if (
            isinstance(interval, bool)
            or not isinstance(interval, (int, float))
            or not 0 < interval < math.inf
        ):
            raise config_error("interval_s", interval, "a finite number of seconds > 0")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise config_error(
                "history_size", size, "an integer >= 1", "e.g. 3600 (an hour at 1 s)"
            )
