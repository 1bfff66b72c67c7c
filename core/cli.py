"""``core-train``: the command name is reserved for a command-line trainer still to come.

Until then it says so and exits with status 2; training runs through the Python API
(``create_optimized_training_optimizer``) or the examples (``make demo``).
"""

from __future__ import annotations

import sys

__all__ = ("main",)


def main(argv: list[str] | None = None) -> int:
    print(
        "core-train is reserved and not implemented yet. Use the Python API "
        "(core.create_optimized_training_optimizer) or examples/email_sequence/train.py.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
