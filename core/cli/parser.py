"""The argument parser every ``core-train`` command uses: errors that name the flag, show
the bad value and list what is allowed (exit status 2), unknown flags with a suggestion,
and the record of which flag set which leaf of the config tree (a leaf set by two flags is
an error naming both)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

__all__ = ("Formatter", "Parser", "choice", "claim", "given", "sets")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Help with room for long flags; an action's ``invocation`` (``--x, --no-x``) replaces
    argparse's repetition of the metavar after each option string."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=36, width=100)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = getattr(action, "invocation", None)
        return shown if isinstance(shown, str) else super()._format_action_invocation(action)

    def _split_lines(self, text: str, width: int) -> list[str]:
        # A flag named in a help text stays whole: --save-top-k, never "--save-" / "top-k".
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with the house error format and no abbreviated flags
    (``--epoch`` is not ``--epochs``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_abbrev=False, formatter_class=Formatter, **kwargs)

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """Parse ``argv``; an unknown flag or a stray value exits with status 2."""
        namespace, extras = self.parse_known_args(list(argv))
        if extras:
            self.error(self._unknown(extras[0]))
        return namespace

    def _unknown(self, word: str) -> str:
        if not word.startswith("-"):
            return f"unexpected argument {word!r} (values follow their flag: --epochs 3)"
        flag = word.split("=", 1)[0]
        known = [s for s in self._option_string_actions if s.startswith("--")]
        close = difflib.get_close_matches(flag, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{flag}: unknown flag{hint} (`{self.prog} --help` lists every flag)"

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 after ``message``, argparse's "argument --x: ..." reworded."""
        found = re.match(r"argument (--[\w-]+)(?:/--[\w-]+)*: (.*)", message, re.S)
        if found:
            flag, rest = found.groups()
            message = f"{flag} {rest}" if rest[:1] in "'\"" else f"{flag}: {rest}"
        self.exit(2, f"{self.prog}: error: {message}\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            (sys.stderr if status else sys.stdout).write(message)
        raise SystemExit(status)


def choice(*values: str) -> Callable[[str], str]:
    """An argparse ``type`` accepting only ``values`` (its error lists them)."""

    def parse(text: str) -> str:
        if text in values:
            return text
        raise argparse.ArgumentTypeError(f"{text!r}: invalid choice; allowed: {', '.join(values)}")

    parse.__name__ = "choice"
    return parse


def given(namespace: argparse.Namespace) -> dict[str, tuple[str, object]]:
    """Dotted path -> (the flag that set it, its value), for the leaves set so far."""
    found: dict[str, tuple[str, object]] = namespace.__dict__.setdefault("tree", {})
    return found


def claim(
    parser: argparse.ArgumentParser,
    namespace: argparse.Namespace,
    path: str,
    flag: str,
    value: object,
) -> None:
    """Record that ``flag`` sets ``path`` to ``value``; another flag that set it already is
    an error naming both (the same flag twice: the last value wins, as usual)."""
    settings = given(namespace)
    earlier = settings.get(path)
    if earlier is not None and earlier[0] != flag:
        parser.error(f"{flag} and {earlier[0]} both set {path}; give only one of them")
    settings[path] = (flag, value)


def sets(namespace: argparse.Namespace) -> dict[str, object]:
    """Dotted path -> value of every leaf a flag set (for ``TrainingConfig.replace``)."""
    return {path: value for path, (_flag, value) in given(namespace).items()}
