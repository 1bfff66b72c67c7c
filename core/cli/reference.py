"""Every command of ``core-train`` and every flag, read from the parsers themselves: the
generated part of docs/cli.md (``python -m core.cli.reference`` prints it, and
tests/test_cli.py fails when the page differs from it)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

from core.cli.commands import check_amp_parser, find_batch_size_parser, info_parser, report_parser
from core.cli.find_lr import find_lr_parser
from core.cli.fit import fit_parser
from core.cli.flags import LeafAction, default_text, negatives
from core.cli.parser import Formatter, Parser

__all__ = ("PARSERS", "flags_of", "reference_markdown")

PARSERS: dict[str, Callable[[], Parser]] = {
    "fit": fit_parser,
    "find-lr": find_lr_parser,
    "report": report_parser,
    "info": info_parser,
    "find-batch-size": find_batch_size_parser,
    "check-amp": check_amp_parser,
}
"""Each command of ``core-train`` (``fit`` when none is named) and its parser."""

_HEADER = ["| flag | what it does |", "| --- | --- |"]
_TREE_HEADER = ["| flag | sets | default |", "| --- | --- | --- |"]  # a config leaf's flag


def _shown(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)


def _own(name: str, parser: Parser) -> list[argparse.Action]:
    """The actions ``core-train NAME --help`` lists; for find-lr, those fit has not."""
    fits = flags_of(fit_parser()) if name == "find-lr" else set()
    return [a for a in parser._actions if _shown(a) and not fits & set(a.option_strings)]


def flags_of(parser: Parser) -> set[str]:
    """Every flag ``parser`` takes (its aliases included), ``--help`` aside."""
    return {s for a in parser._actions if _shown(a) for s in a.option_strings}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("%%", "%").replace("|", "\\|")


def _row(formatter: Formatter, action: argparse.Action) -> str:
    if not action.option_strings:  # a positional: its metavar
        flag = f"`{action.metavar or action.dest}`"
    else:
        flag = f"`{formatter._format_action_invocation(action)}`"
    if isinstance(action, LeafAction):
        leaf = action.leaf
        older = [*leaf.aliases, *negatives(leaf)[1:]]  # the aliases and their --no- forms
        also = f" (also `{'`, `'.join(older)}`)" if older else ""
        default = default_text(leaf.default).replace("%%", "%")
        return f"| {flag}{also} | `{leaf.path}` | `{default}` |"
    said = formatter._expand_help(action) if action.help else ""
    return f"| {flag} | {_cell(said)} |"


def _command(name: str, parser: Parser) -> list[str]:
    formatter = Formatter(parser.prog)
    first = re.split(r"(?<=\.)\s", _cell(parser.description or ""), maxsplit=1)[0]
    lines = [f"### `core-train {name}`", "", first]
    if name == "find-lr":
        lines[-1] += " It takes every flag of `fit`, and these:"
    own = _own(name, parser)
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a in own]
        if not actions:
            continue
        tree = all(isinstance(a, LeafAction) for a in actions)
        said = group.description if group.description and not tree else None  # --help has it
        title = f"**{group.title}**" + (f": {_cell(said)}" if said else "")
        header = _TREE_HEADER if tree else _HEADER
        lines += ["", title, "", *header, *(_row(formatter, a) for a in actions)]
    return lines


def reference_markdown() -> str:
    """The generated part of docs/cli.md: one section per command, one table per group."""
    lines: list[str] = []
    for name, build in PARSERS.items():
        lines += [*_command(name, build()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(reference_markdown())
