"""``core-train`` (and ``python -m core``): train from the command line with flags generated
from the config tree, shorthand switches, TOML configs and the commands around a run.

``main`` returns the exit status: 0 done, 1 failed, 2 bad command line or setting.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from core.cli.commands import (
    check_amp_command,
    find_batch_size_command,
    info_command,
    report_command,
)
from core.cli.find_lr import find_lr_command
from core.cli.train import FitOutcome, run_fit
from core.errors import resume_phrased_for

__all__ = ("FitOutcome", "main", "run_fit")


def _commands() -> dict[str, Callable[[Sequence[str]], int]]:
    return {
        "fit": lambda argv: run_fit(argv).exit_code,
        "report": report_command,
        "info": info_command,
        "find-batch-size": find_batch_size_command,
        "find-lr": find_lr_command,
        "check-amp": check_amp_command,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``core-train`` with ``argv`` (default: ``sys.argv[1:]``); the exit status.

    The first word picks the command (``fit``, ``report``, ``info``, ``find-batch-size``,
    ``find-lr``, ``check-amp``); without one it is ``fit``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    commands = _commands()
    name = args[0] if args and args[0] in commands else "fit"
    rest = args[1:] if args and args[0] == name else args
    try:
        with resume_phrased_for("command line"):  # a stopped run says: --resume auto
            return commands[name](rest)
    except SystemExit as done:  # argparse: --help (0) and bad command lines (2)
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
