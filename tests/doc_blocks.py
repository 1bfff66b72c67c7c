"""The fenced code blocks of the documentation (README.md and docs/**/*.md), by heading.

A block belongs to every heading above it, up to the page's title: ``python_blocks(
"docs/training.md", "## Train, reload, predict")`` is every python block in that section,
its subsections included. Headings are named by their whole line, hashes and all, so a
section is never mistaken for another one of the same words at another level.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import pythonpath

ROOT = Path(__file__).resolve().parent.parent
HEADING = re.compile(r"^(#{1,6}) \S")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")  # indented fences too (inside list items)


@dataclass(frozen=True)
class Block:
    """One fenced block: its file (relative to the root), the headings it sits under
    (outermost first), its language tag, its text and the line its fence opens on."""

    file: str
    headings: tuple[str, ...]
    language: str
    code: str
    line: int


def doc_files() -> list[str]:
    """Every documentation file, relative to the root: README.md, then docs/ in order."""
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))
    return ["README.md", *pages]


def parse(file: str) -> tuple[list[Block], list[str]]:
    """The fenced blocks of ``file`` and its heading lines (outside blocks), in order."""
    stack: list[tuple[int, str]] = []
    blocks: list[Block] = []
    seen: list[str] = []
    fence: tuple[str, str, int, list[str]] | None = None  # indent, language, line, body
    for number, line in enumerate((ROOT / file).read_text().splitlines(), start=1):
        if fence is not None:
            indent, language, start, body = fence
            if line.strip() == "```":
                code = "\n".join(row.removeprefix(indent) for row in body) + "\n"
                headings = tuple(text for _, text in stack)
                blocks.append(Block(file, headings, language, code, start))
                fence = None
            else:
                body.append(line)
        elif opened := FENCE.match(line):
            fence = (opened[1], opened[2], number, [])
        elif heading := HEADING.match(line):
            level = len(heading[1])
            stack = [(lv, text) for lv, text in stack if lv < level] + [(level, line.rstrip())]
            seen.append(line.rstrip())
    assert fence is None, f"{file}: the block opened on line {fence[2]} is never closed"
    return blocks, seen


def code_blocks(file: str) -> list[Block]:
    """Every fenced block of ``file`` with the headings it sits under."""
    return parse(file)[0]


def python_blocks(file: str, heading: str) -> list[str]:
    """The python blocks under ``heading`` (a whole heading line) of ``file``."""
    blocks, seen = parse(file)
    assert heading in seen, f"{file} has no heading {heading!r}"
    return [b.code for b in blocks if b.language == "python" and heading in b.headings]


def run_program(program: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``program`` as a user would paste it: a fresh interpreter in ``cwd``, the project
    importable, nothing else of this process's environment."""
    return subprocess.run(
        [sys.executable, "-c", program],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env={"PYTHONPATH": pythonpath(), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
    )
