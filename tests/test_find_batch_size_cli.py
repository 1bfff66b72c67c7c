"""``core-train find-batch-size`` says when its answer is the ``--max-batch-size`` cap (every
size up to it fit, so a larger batch might too) rather than the memory limit."""

from __future__ import annotations

import json

import pytest

from core.cli import main

SEARCH = [
    "find-batch-size",
    "--model",
    "tests.test_lr_finder:tiny_model",
    "--input-shape",
    "4,8",
    "--device",
    "cpu",
]
CAP_NOTE = "(the --max-batch-size cap: every size up to it fit; raise it to search further)"


def test_an_answer_at_the_cap_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SEARCH, "--max-batch-size", "64"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"batch size: 64 {CAP_NOTE} (target ")
    assert main([*SEARCH, "--max-batch-size", "64", "--json"]) == 0
    search = json.loads(capsys.readouterr().out)
    assert search["batch_size"] == 64 and search["capped"] is True
    assert search["max_batch_size"] == 64 and all(t["fits"] for t in search["trials"])


def test_an_answer_below_the_cap_is_the_memory_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SEARCH, "--target-memory-gb", "0.0001", "--json"]) == 0
    search = json.loads(capsys.readouterr().out)
    assert search["capped"] is False and search["batch_size"] < search["max_batch_size"] == 4096
    assert main([*SEARCH, "--target-memory-gb", "0.0001"]) == 0
    assert "cap" not in capsys.readouterr().out.splitlines()[0]


def test_a_bad_cap_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SEARCH, "--max-batch-size", "0"]) == 2
    assert "--max-batch-size=0 is invalid; allowed: an integer >= 1" in capsys.readouterr().err
