"""``docs/layout.md``'s map of ``core/``, drawn from the tree: its packages floor by floor, each
floor importing only the floors beneath it, and every module with its docstring's first
sentence.

Regenerate the section between the ``layout`` markers with::

    python -m tests.layout_doc
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.test_architecture import GRAPH, MODULES, ROOT

START, END = "<!-- layout:start -->\n", "<!-- layout:end -->"
DOC = ROOT.parent / "docs" / "layout.md"
WIDTH = 100
NAME_COLUMN = 34


def unit_of(module: str) -> str:
    """The room a module belongs to: ``core.trainer``'s subpackages and the other packages
    whole, each module at the top of ``core`` alone."""
    parts = module.split(".")
    depth = 3 if parts[:2] == ["core", "trainer"] and len(parts) > 2 else 2
    unit = ".".join(parts[:depth])
    return unit if unit in MODULES else module


@cache
def arrows() -> dict[str, set[str]]:
    """Which rooms each room imports (``core`` itself, the public names, left out)."""
    graph: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        if name in ("core", "core.trainer"):
            continue
        graph.setdefault(unit_of(name), set()).update(
            unit_of(t) for t in targets if t in MODULES and t not in ("core", "core.trainer")
        )
    return {room: targets - {room} for room, targets in graph.items()}


def floors() -> dict[str, int]:
    """Each room's floor: one above the highest room it imports (0: it imports none)."""
    graph, floor = arrows(), {}

    def height(room: str) -> int:
        if room not in floor:
            floor[room] = 1 + max((height(t) for t in graph[room]), default=-1)
        return floor[room]

    for room in graph:
        height(room)
    return floor


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, without reST markup."""
    text = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(text.split("\n\n")[0].split())
    sentence = re.split(r"(?<=\.)\s", paragraph, maxsplit=1)[0].rstrip(":.")
    return re.sub(r":\w+:`~?([^`]+)`", r"\1", sentence).replace("``", "")


def entry(indent: int, name: str, text: str) -> list[str]:
    """``name`` and ``text`` wrapped into the map's two columns."""
    head = " " * indent + name
    lines, line = [], head.ljust(NAME_COLUMN) if len(head) < NAME_COLUMN else head + " "
    for word in text.split():
        if len(line) + len(word) > WIDTH and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * NAME_COLUMN
        line += word + " "
    lines.append(line.rstrip())
    return lines


def room_lines(module: str, indent: int = 2, name: str | None = None) -> list[str]:
    """A room: one module, or a package with its modules and subpackages (recursively)."""
    path = MODULES[module]
    if path.name != "__init__.py":
        return entry(indent, name or path.name, summary(path))
    lines = entry(indent, (name or module.rsplit(".", 1)[1]) + "/", summary(path))
    for child in sorted(m for m in MODULES if m.rsplit(".", 1)[0] == module):
        lines += room_lines(child, indent + 2)
    return lines


def layout_markdown() -> str:
    """The map: floor by floor, the highest first."""
    floor = floors()
    out = ["```", "core/", *entry(2, "__init__.py", summary(MODULES["core"]))]
    for level in sorted(set(floor.values()), reverse=True):
        rooms = sorted(r for r in floor if floor[r] == level)
        out.append(f"  # floor {level}")
        for room in rooms:
            relative = "/".join(room.split(".")[1:])
            package = MODULES[room].name == "__init__.py"
            out += room_lines(room, name=relative if package else relative + ".py")
    out.append("```")
    return "\n".join(out) + "\n"


def written() -> str:
    text = DOC.read_text()
    return text[text.index(START) + len(START) : text.index(END)]


def main() -> None:
    text = DOC.read_text()
    head, tail = text[: text.index(START) + len(START)], text[text.index(END) :]
    DOC.write_text(head + layout_markdown() + tail)


if __name__ == "__main__":
    main()
