"""The modules of ``core`` past the length a reviewer reads in one sitting, longest first.

Length is a signal, not a rule: a long module is asked whether it does two jobs, and split by
job if it does. ``make sizes`` (and ``make test``, at its end) prints this list::

    python -m tests.module_sizes
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "core"
SIGNAL = 300


def long_modules(signal: int = SIGNAL) -> list[tuple[int, str]]:
    """``(lines, path)`` of each module of ``core`` longer than ``signal`` lines."""
    sizes = ((len(p.read_text().splitlines()), p) for p in ROOT.rglob("*.py"))
    return sorted(
        ((n, str(p.relative_to(ROOT.parent))) for n, p in sizes if n > signal), reverse=True
    )


def main() -> None:
    long = long_modules()
    sys.stdout.write(f"modules of core past {SIGNAL} lines: {len(long)}\n")
    sys.stdout.writelines(f"  {n:5d}  {path}\n" for n, path in long)


if __name__ == "__main__":
    main()
