"""The config tree's leaves as the command line sees them: each leaf's dotted path, its flag,
its type (read from the dataclass annotations), default and help, and how a string (a
flag's value, a TOML string) becomes the leaf's value."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import torch

from core.cli.factories import import_object
from core.cli.renames import RENAMES
from core.config import TrainingConfig
from core.facades.flat import FLAT_KEYWORDS

__all__ = ("Leaf", "leaf_for", "leaves", "plain")

_TRUE = ("true", "yes", "on")
_FALSE = ("false", "no", "off")
_HELP_LIMIT = 220


@dataclass(frozen=True)
class Leaf:
    """One setting of the tree. ``kinds`` are the annotation's members without ``None``
    (a ``Literal``'s values gathered in ``choices``); ``optional``: ``None`` is allowed."""

    path: str
    flag: str
    kinds: tuple[Any, ...]
    choices: tuple[object, ...]
    optional: bool
    default: object
    help: str
    aliases: tuple[str, ...] = ()
    """Older spellings of ``flag`` that still set the leaf (``--monitor``)."""

    @property
    def is_switch(self) -> bool:
        """A plain ``bool``: ``--x`` / ``--no-x``."""
        return self.kinds == (bool,) and not self.choices and not self.optional

    @property
    def takes_bool(self) -> bool:
        return bool in self.kinds

    def parse(self, text: str) -> object:
        """The leaf's value for ``text``; ``ArgumentTypeError`` says what is allowed."""
        word = text.strip().lower()
        if self.optional and word == "none":
            return None
        for choice in self.choices:
            if text == str(choice):
                return choice
        if self.takes_bool and word in _TRUE + _FALSE:
            return word in _TRUE
        for kind in self.kinds:
            value = _convert(kind, text)
            if value is not _NO:
                return value
        raise argparse.ArgumentTypeError(f"{text!r}: invalid value; allowed: {self.allowed()}")

    def allowed(self) -> str:
        parts = [", ".join(str(c) for c in self.choices)] if self.choices else []
        parts += [_KIND_TEXT.get(k, "") or _describe_kind(k) for k in self.kinds]
        parts += ["none"] if self.optional else []
        return "; or ".join(p for p in dict.fromkeys(parts) if p)

    def metavar(self) -> str:
        if not self.choices:
            return self.path.rsplit(".", 1)[-1].upper()
        words = [str(c) for c in self.choices] + ["true", "false"] * self.takes_bool
        return "{" + ",".join(words + ["none"] * self.optional) + "}"


_NO = object()
_KIND_TEXT: dict[Any, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    Path: "a path",
    torch.dtype: "",
}


def _describe_kind(kind: Any) -> str:
    origin = typing.get_origin(kind)
    if origin in (tuple, Sequence, list) or kind in (tuple, list):
        args = [a for a in typing.get_args(kind) if a is not Ellipsis]
        inner = _KIND_TEXT.get(args[0], "module:name") if args else "a value"
        return f"comma-separated values ({inner})"
    if origin is Callable or kind is Any:
        return "an import path 'package.module:name'"
    if origin is dict or kind is dict:
        return "a JSON object"
    return getattr(kind, "__name__", str(kind))


def _convert(kind: Any, text: str) -> object:
    """``text`` as ``kind``, or ``_NO`` when it is not one."""
    if kind is int:
        return int(text) if re.fullmatch(r"[+-]?\d+", text.strip()) else _NO
    if kind is float:
        try:
            return float(text)
        except ValueError:
            return _NO
    if kind in (str, Path):
        return text
    origin = typing.get_origin(kind)
    if origin in (tuple, Sequence, list) or kind in (tuple, list):
        args = typing.get_args(kind)
        items = [part.strip() for part in text.split(",") if part.strip()]
        element = args[0] if args else str
        fixed = origin is tuple and args and args[-1] is not Ellipsis
        if fixed and len(args) != len(items):
            return _NO
        values = [_convert(element, item) for item in items]
        return _NO if _NO in values else tuple(values)
    if origin is Callable or kind is Any:
        try:
            return import_object(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    if origin is dict or kind is dict:
        try:
            value = json.loads(text)
        except ValueError:
            return _NO
        return value if isinstance(value, dict) else _NO
    return _NO


def _members(annotation: Any) -> tuple[list[Any], list[object], bool]:
    """``(kinds, choices, optional)`` of an annotation (unions and literals flattened)."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        kinds: list[Any] = []
        choices: list[object] = []
        optional = False
        for arg in typing.get_args(annotation):
            k, c, o = _members(arg)
            kinds += [x for x in k if x not in kinds]
            choices += [x for x in c if x not in choices]
            optional = optional or o
        return kinds, choices, optional
    if annotation is type(None):
        return [], [], True
    if typing.get_origin(annotation) is Literal:
        return [], list(typing.get_args(annotation)), False
    return [annotation], [], False


def _table(lines: list[str]) -> tuple[int, int, int]:
    """``(first, last, column)``: the lines of the docstring's RST table (border to border)
    and where its second column starts; ``(0, -1, 0)`` without one."""
    borders = [i for i, line in enumerate(lines) if re.match(r"=+\s+=+", line)]
    if not borders:
        return 0, -1, 0
    first_border = re.match(r"(=+\s+)=", lines[borders[0]])
    return borders[0], borders[-1], len(first_border.group(1)) if first_border else 0


def _table_row(lines: list[str], name: str) -> str:
    """The text of the table row for ``name``, continuation lines included."""
    first, last, column = _table(lines)
    for i in range(first, last + 1):
        row = re.match(rf"``{re.escape(name)}``\s+(.*)", lines[i])
        if row is None:
            continue
        text = [row.group(1)]
        for more in lines[i + 1 : last]:
            if more[:column].strip() or not more.strip():
                break
            text.append(more.strip())
        return " ".join(text)
    return ""


def _help(section: type, name: str) -> str:
    """What the section's docstring says of the leaf ``name``: its row of a field table, the
    paragraph that starts with it, or the first sentence that names it; else ``""``."""
    lines = (inspect.getdoc(section) or "").splitlines()
    found = _table_row(lines, name)
    if not found:
        first, last, _ = _table(lines)
        prose = lines[:first] + lines[last + 1 :] if last >= 0 else lines
        text = re.sub(r"\n\s*[-*] ", "\n\n", "\n".join(prose))  # list items: paragraphs
        paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
        mark = re.compile(rf"``{re.escape(name)}(``|=|\s)")
        sentences = [
            sentence
            for paragraph in paragraphs
            for sentence in re.split(r"(?<=[.;])\s+(?=[A-Z`(])", paragraph)
        ]
        found = next((s for s in sentences if mark.match(s)), "")
        found = found or next((s for s in sentences if mark.search(s)), "")
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?(\w+)`", r"\1", found).replace("``", "")
    text = text if len(text) <= _HELP_LIMIT else text[: _HELP_LIMIT - 3] + "..."
    return text.replace("%", "%%")


def _flag(path: str, keyword: str | None) -> str:
    """``--<flat keyword>`` in kebab case (``--amp-hysteresis``), else ``--<section>-<leaf>``
    (``--data-loader-pin-memory``)."""
    return "--" + (keyword or path.replace(".", "-")).replace("_", "-")


def _walk(node: object, prefix: str, keywords: dict[str, str]) -> list[Leaf]:
    kind = type(node)
    hints = typing.get_type_hints(kind)
    found: list[Leaf] = []
    for field in dataclasses.fields(node):  # type: ignore[arg-type]
        value = getattr(node, field.name)
        path = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found += _walk(value, path + ".", keywords)
            continue
        kinds, choices, optional = _members(hints[field.name])
        renamed = RENAMES.get(path)
        found.append(
            Leaf(
                path=path,
                flag=renamed.flag if renamed else _flag(path, keywords.get(path)),
                kinds=tuple(kinds),
                choices=tuple(choices),
                optional=optional,
                default=value,
                help=renamed.help if renamed else _help(kind, field.name),
                aliases=renamed.aliases if renamed else (),
            )
        )
    return found


@functools.cache
def leaves() -> tuple[Leaf, ...]:
    """Every leaf of :class:`~core.config.TrainingConfig`, in the tree's order."""
    keywords = {path: keyword for keyword, path in FLAT_KEYWORDS.items()}
    return tuple(_walk(TrainingConfig(), "", keywords))


def leaf_for(path: str) -> Leaf | None:
    """The leaf at dotted ``path``, or None."""
    return next((leaf for leaf in leaves() if leaf.path == path), None)


def plain(value: object) -> object:
    """A leaf's value as the command line and TOML write it (None: ``"none"``; a class or
    function: ``"module:name"``; a dtype: its name; tuples: lists)."""
    if value is None:
        return "none"
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    name = getattr(value, "__qualname__", None)
    module = getattr(value, "__module__", None)
    return f"{module}:{name}" if name and module else str(value)
