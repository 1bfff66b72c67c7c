"""Where the per-batch facades' records go: the user's logger, or warnings to the process log.

The per-batch facades have no run directory; the step loop's records (``train_step``,
``nonfinite_skipped``, ``precision_fallback``...) go to the ``logger`` given to them
(a ``logging.Logger`` or a structlog logger): warnings at warning level, the rest at debug.
Without a logger only the warnings are written, to structlog's ``core`` logger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import structlog

__all__ = ("Emit", "emit_to")

Emit = Callable[..., None]

_WARNINGS = frozenset({"nonfinite_skipped", "precision_fallback", "oom_recovered"})
_process_log = structlog.get_logger("core")


def _is_warning(event: str, fields: dict[str, Any]) -> bool:
    if event == "amp_compatibility":
        return bool(fields.get("blockers") or fields.get("warnings"))
    return event in _WARNINGS


def emit_to(logger: Any | None) -> Emit:
    """An ``emit(event, **fields)`` writing to ``logger`` (see the module docstring)."""

    def emit(event: str, **fields: Any) -> None:
        warning = _is_warning(event, fields)
        if logger is None:
            if warning:
                _process_log.warning(event, **fields)
        elif isinstance(logger, logging.Logger):
            logger.log(logging.WARNING if warning else logging.DEBUG, "%s %s", event, fields)
        else:
            getattr(logger, "warning" if warning else "debug")(event, **fields)

    return emit
