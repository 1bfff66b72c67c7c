"""Lightning's parity protocol (``benchmarks/parity.py``) runs, and core with its defaults
trains exactly like the plain loop beside it: the same losses to 5 decimals, run after run.
The timing and memory bands are the benchmark's to judge, never a test's."""

from __future__ import annotations

from benchmarks.parity import KINDS, bands, measure


def test_core_with_its_defaults_trains_exactly_like_a_plain_loop() -> None:
    measured = measure("rnn", runs=2, epochs=2, sleep_s=0.0)
    assert all(len(measured[kind].losses) == 2 for kind in KINDS)
    rows = bands(measured, epochs=2)
    assert [row["kind"] for row in rows] == ["core", "core, lean"]
    assert all(row["losses_equal"] for row in rows), rows
    assert measured["plain"].losses[0] != measured["plain"].losses[1]  # seeds differ per run
