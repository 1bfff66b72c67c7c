"""Numbers for people: percentiles, durations, bytes, rates and fractions as report text.
``None`` (unknown) gives a dash or a given note, so partial data never raises.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ("count", "gib", "percent", "percentile", "rate", "seconds", "value")

_DASH = "-"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0 to 100) by linear interpolation, as ``numpy.percentile``
    computes it by default; None for no values.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    """
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * min(max(q, 0.0), 100.0) / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def seconds(value: float | None, none: str = _DASH) -> str:
    """A duration with a unit that suits it.

    >>> seconds(0.0042), seconds(75.0), seconds(7384.0)
    ('4.20 ms', '1 min 15.0 s', '2 h 03 min 04 s')
    """
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
    """Bytes as GiB (MiB below 1 GiB).

    >>> gib(3 * 2**30), gib(512 * 2**20)
    ('3.00 GiB', '512.0 MiB')
    """
    if value is None or not math.isfinite(value):
        return none
    if abs(value) < 2**30:
        return f"{value / 2**20:.1f} MiB"
    return f"{value / 2**30:.2f} GiB"


def rate(value: float | None, unit: str = "samples/s", none: str = _DASH) -> str:
    """A throughput with thousands separators and one decimal.

    >>> rate(12345.67)
    '12,345.7 samples/s'
    """
    if value is None or not math.isfinite(value):
        return none
    return f"{value:,.1f} {unit}"


def percent(fraction: float | None, none: str = _DASH) -> str:
    """A fraction (0 to 1) as a percentage.

    >>> percent(0.2087)
    '20.9%'
    """
    if fraction is None or not math.isfinite(fraction):
        return none
    return f"{fraction * 100:.1f}%"


def value(number: float | None, none: str = _DASH) -> str:
    """A plain number with four significant digits (losses, metrics, scales).

    >>> value(0.73669046), value(65536.0)
    ('0.7367', '6.554e+04')
    """
    if number is None or not math.isfinite(number):
        return none
    return f"{number:.4g}"


def count(number: int | float | None, none: str = _DASH) -> str:
    """An integer count with thousands separators.

    >>> count(1234567)
    '1,234,567'
    """
    if number is None or not math.isfinite(number):
        return none
    return f"{round(number):,d}"
