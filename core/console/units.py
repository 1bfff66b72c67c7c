"""Numbers as a person reads them on a console: counts (1.2M), durations (1m 23s), losses."""

from __future__ import annotations

import math

from core.checks import is_number

__all__ = ("format_count", "format_duration", "format_number", "format_percent")

_SUFFIXES = ("", "K", "M", "B", "T")


def format_count(value: object) -> str:
    """A count or rate, shortened past a thousand: ``610``, ``3.4K``, ``1.2M``; ``?`` when
    ``value`` is not a finite number.

    >>> format_count(1234), format_count(999_960), format_count(12)
    ('1.2K', '1.0M', '12')
    """
    if not (is_number(value) and math.isfinite(value)):
        return "?"
    number, index = float(value), 0
    while abs(number) >= 999.95 and index < len(_SUFFIXES) - 1:
        number, index = number / 1000, index + 1
    return f"{number:.0f}" if index == 0 else f"{number:.1f}{_SUFFIXES[index]}"


def format_duration(seconds: object) -> str:
    """Wall time: ``850ms``, ``4.2s``, ``1m 23s``, ``2h 5m 7s``; ``?`` when unknown."""
    if not (is_number(seconds) and math.isfinite(seconds) and seconds >= 0):
        return "?"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes}m {secs}s" if hours else f"{minutes}m {secs}s"


def format_number(value: object) -> str:
    """A loss or metric with four significant digits (``n/a`` when null or not finite).

    >>> format_number(0.727417), format_number(12345.6), format_number(None)
    ('0.7274', '12345.6', 'n/a')
    """
    if not (is_number(value) and math.isfinite(value)):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:.1f}"
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.3e}"
    return f"{value:.4g}"


def format_percent(value: object) -> str:
    """A fraction in [0, 1] as a percentage, ``48.44%`` (``n/a`` when unknown)."""
    if not (is_number(value) and math.isfinite(value)):
        return "n/a"
    return f"{value:.2%}"
