"""The console side of a run: a start banner, progress bars (or plain lines), warnings and
an end summary, all built from the run's records; and the model summary table.

Example::

    callbacks=[ProgressBar(mode="lines")]        # one plain line per epoch
    format_model_summary(summarize_model(model))
"""

from __future__ import annotations

from core.console.banner import format_banner
from core.console.digest import RunDigest
from core.console.lines import format_epoch_line, format_event_line
from core.console.model_summary import format_model_summary, summarize_model
from core.console.progress import ProgressBar, ProgressMode
from core.console.summary import format_summary
from core.console.units import format_count, format_duration

__all__ = (
    "ProgressBar",
    "ProgressMode",
    "RunDigest",
    "format_banner",
    "format_count",
    "format_duration",
    "format_epoch_line",
    "format_event_line",
    "format_model_summary",
    "format_summary",
    "summarize_model",
)
