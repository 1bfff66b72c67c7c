"""Flags generated from the config tree: every leaf of ``TrainingConfig`` gets one, so
``--help`` is complete and a new setting gets its flag without code here. Names come from
``core.cli.leaves``. A ``bool`` is ``--x``/``--no-x``; a leaf taking ``true``/``false`` besides
other values is ``--x [VALUE]``/``--no-x``; ``Literal`` values are the choices; ``none`` sets an
optional leaf to ``None``; sequences are comma-separated. A flag not given leaves its leaf
alone."""

from __future__ import annotations

import argparse
import inspect
import re
import textwrap
from collections.abc import Sequence
from typing import Any

from core.cli.leaves import Leaf, leaves, plain
from core.cli.parser import claim
from core.cli.renames import SECTION_NOTES
from core.config import TrainingConfig

__all__ = (
    "LeafAction",
    "add_tree_flags",
    "default_text",
    "negatives",
    "option_strings",
    "section_title",
)


_BARE = object()  # a flag given without its optional value: ``--compile`` is true


class LeafAction(argparse.Action):
    """Sets one leaf (recorded with :func:`~core.cli.parser.claim`); ``--no-x`` sets False."""

    def __init__(self, option_strings: Sequence[str], dest: str, leaf: Leaf, **kw: Any) -> None:
        self.leaf = leaf
        self.negative = f"--no-{leaf.flag[2:]}" if leaf.takes_bool else None
        self.negatives = negatives(leaf)
        self.invocation = f"{leaf.flag} {leaf.metavar()}"  # the aliases: in the help text
        if leaf.is_switch:
            kw["nargs"] = 0
            self.invocation = f"{leaf.flag}, {self.negative}"
        elif leaf.takes_bool:
            kw["nargs"], kw["const"] = "?", _BARE
            self.invocation = f"{leaf.flag} [{leaf.metavar()}], {self.negative}"
        super().__init__(option_strings, dest, **kw)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        flag = option_string or self.leaf.flag
        bare = self.nargs == 0 or values is _BARE
        if flag in self.negatives:
            if not bare:
                parser.error(f"{flag} takes no value (it is {self.leaf.flag} false)")
            value: object = False
        else:
            value = True if bare else values
        claim(parser, namespace, self.leaf.path, flag, value)


def option_strings(leaf: Leaf) -> list[str]:
    """Every spelling that sets ``leaf``: its flag, its aliases, and their ``--no-`` forms."""
    return [leaf.flag, *leaf.aliases, *negatives(leaf)]


def negatives(leaf: Leaf) -> list[str]:
    """The ``--no-`` forms of a leaf that takes ``true``/``false``, aliases included."""
    return [f"--no-{s[2:]}" for s in (leaf.flag, *leaf.aliases)] if leaf.takes_bool else []


def default_text(value: object) -> str:
    """A default as a user types it (``none``, ``true``, ``a,b``)."""
    shown = plain(value)
    if isinstance(shown, bool):
        return str(shown).lower()
    if isinstance(shown, list):
        return ",".join(map(str, shown)) or "(empty)"
    return str(shown).replace("%", "%%")


def section_title(section: str) -> tuple[str, str]:
    """``(title, description)`` of a section's group: its path and class, and the first
    sentence of the class docstring."""
    node: Any = TrainingConfig()
    for part in section.split("."):
        node = getattr(node, part)
    doc = " ".join((inspect.getdoc(type(node)) or "").split())
    first = SECTION_NOTES.get(section) or re.split(r"(?<=\.)\s", doc, maxsplit=1)[0]
    first = re.sub(r":\w+:`~?(?:[\w.]+\.)?(\w+)`", r"\1", first).replace("``", "")
    wrapped = textwrap.fill(first, width=94)
    return f"config: {section} ({type(node).__name__})", wrapped.replace("%", "%%")


def _help(leaf: Leaf) -> str:
    parts = [leaf.help] if leaf.help else []
    complex_kind = any(k not in (bool, int, float, str) for k in leaf.kinds)
    if complex_kind and not leaf.choices:
        parts.append(f"Allowed: {leaf.allowed()}.")
    parts.append(f"[{leaf.path}; default: {default_text(leaf.default)}]")
    if leaf.aliases:
        parts.append(f"(also spelt {', '.join(leaf.aliases)})")
    return " ".join(parts)


def add_tree_flags(parser: argparse.ArgumentParser) -> None:
    """One argument group per section of the tree, one flag per leaf."""
    groups: dict[str, Any] = {}
    for leaf in leaves():
        section = leaf.path.rsplit(".", 1)[0]
        if section not in groups:
            groups[section] = parser.add_argument_group(*section_title(section))
        groups[section].add_argument(
            *option_strings(leaf),
            action=LeafAction,
            leaf=leaf,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            type=None if leaf.is_switch else leaf.parse,
            metavar=leaf.metavar(),
            help=_help(leaf),
        )
