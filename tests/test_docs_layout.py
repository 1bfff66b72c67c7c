"""``docs/layout.md`` draws the tree as it is."""

from __future__ import annotations

import re

from tests.layout_doc import DOC, floors, layout_markdown, written
from tests.test_architecture import TRAINER_LAYERS


def test_the_layout_page_is_drawn_from_the_tree() -> None:
    assert written() == layout_markdown(), (
        "docs/layout.md differs from the tree: run `python -m tests.layout_doc`"
    )


def test_the_facades_stand_over_the_job_and_the_job_over_its_layers() -> None:
    floor = floors()
    chain = ["core.facades", *(f"core.trainer.{name}" for name in reversed(TRAINER_LAYERS))]
    heights = [floor[room] for room in chain]
    assert heights == sorted(set(heights), reverse=True)


def test_where_to_change_what_names_files_and_names_that_exist() -> None:
    text = DOC.read_text()
    table = text[text.index("## Where to change what") :]
    rows = [line for line in table.splitlines() if line.startswith("| a ")]
    assert len(rows) >= 8
    repository = DOC.parent.parent
    paths = re.findall(r"`((?:core|tests|docs)/[\w/]+\.(?:py|md)|pyproject\.toml)`", table)
    assert [p for p in paths if not (repository / p).exists()] == []
    # "`RULES` in `core/...py`", "`_HOOKS` of `core/...py`": the name is in that file
    named = re.findall(r"`(\w+)`(?: and `(\w+)`)? (?:in|of) `(core/[\w/]+\.py)`", table)
    missing = [
        (name, path)
        for first, second, path in named
        for name in (first, second)
        if name and name not in (repository / path).read_text()
    ]
    assert len(named) >= 5 and missing == []
