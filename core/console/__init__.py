"""The console side of a run: a start banner, progress bars (or plain lines), warnings and
an end summary, all built from the run's records; and the model summary table.

Example::

    callbacks=[ProgressBar(mode="lines")]        # one plain line per epoch
    format_model_summary(summarize_model(model))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

# Each name's module loads when first asked for: importing one module of this package
# (a run imports a few) loads none of the others.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ProgressBar": "core.console.progress",
        "ProgressMode": "core.console.progress",
        "RunDigest": "core.console.digest",
        "format_banner": "core.console.banner",
        "format_count": "core.console.units",
        "format_duration": "core.console.units",
        "format_epoch_line": "core.console.lines",
        "format_event_line": "core.console.lines",
        "format_model_summary": "core.console.model_summary",
        "format_summary": "core.console.summary",
        "summarize_model": "core.console.model_summary",
    },
)
