"""Numbers for people: percentiles, durations, bytes, rates and fractions as report text.
``None`` (unknown) gives a dash or a given note, so partial data never raises."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ("count", "gib", "percent", "percentile", "rate", "seconds", "value")

_DASH = "-"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0 to 100) by linear interpolation, as ``numpy.percentile``
    computes it by default; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * min(max(q, 0.0), 100.0) / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def seconds(value: float | None, none: str = _DASH) -> str:
    """A duration with a unit that suits it."""
    if value is None or not math.isfinite(value):
        return none
    if value < 1e-3:
        return f"{value * 1e6:.0f} us"
    if value < 1.0:
        return f"{value * 1e3:.2f} ms"
    if value < 60.0:
        return f"{value:.2f} s"
    if value < 3600.0:
        minutes, rest = divmod(value, 60.0)
        return f"{minutes:.0f} min {rest:.1f} s"
    hours, rest = divmod(round(value), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours} h {minutes:02d} min {secs:02d} s"


def gib(value: float | None, none: str = _DASH) -> str:
    """Bytes as GiB (MiB below 1 GiB)."""
    if value is None or not math.isfinite(value):
        return none
    if abs(value) < 2**30:
        return f"{value / 2**20:.1f} MiB"
    return f"{value / 2**30:.2f} GiB"


def rate(value: float | None, unit: str = "samples/s", none: str = _DASH) -> str:
    """A throughput with thousands separators and one decimal."""
    if value is None or not math.isfinite(value):
        return none
    return f"{value:,.1f} {unit}"


def percent(fraction: float | None, none: str = _DASH) -> str:
    """A fraction (0 to 1) as a percentage."""
    if fraction is None or not math.isfinite(fraction):
        return none
    return f"{fraction * 100:.1f}%"


def value(number: float | None, none: str = _DASH) -> str:
    """A plain number with four significant digits (losses, metrics, scales)."""
    if number is None or not math.isfinite(number):
        return none
    return f"{number:.4g}"


def count(number: int | float | None, none: str = _DASH) -> str:
    """An integer count with thousands separators."""
    if number is None or not math.isfinite(number):
        return none
    return f"{round(number):,d}"
