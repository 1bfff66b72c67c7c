"""``python -m core``: the ``core-train`` command line (``python -m core --help``)."""

from __future__ import annotations

import sys

from core.cli import main

__all__ = ("main",)

if __name__ == "__main__":
    sys.exit(main())
