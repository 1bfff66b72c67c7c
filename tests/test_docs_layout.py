"""``docs/layout.md`` draws the tree as it is."""

from __future__ import annotations

from tests.layout_doc import floors, layout_markdown, written
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
