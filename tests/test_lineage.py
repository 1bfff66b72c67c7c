"""Checkpoint lineages across kills and restarts, with real processes and SIGKILL
(``tests/lineage_jobs.py`` forks each job): a kill at every filesystem operation of every
commit, retention over a hundred restarts, settings that are honoured or refused, the
lineage ``resume="auto"`` takes, a run that stopped early staying finished, a wall clock
stepped back between runs, and a lineage held by a live run."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from core.checkpointing.manifest import followed
from core.checkpointing.store import CheckpointStore
from tests.helpers import ROOT, make_model, pythonpath
from tests.lineage_jobs import at_forward, build

CHECKPOINTS = Path("lineage") / "checkpoints"
ADAMW = {"name": "AdamW", "lr": 0.01, "weight_decay": 0.01}
BASE: dict[str, Any] = {
    "seed": 0,
    "checkpoint_every_n_steps": 3,
    "keep_last_n": 1,
    "save_top_k": 2,
    "monitor": "val_loss",
    "save_last": True,
}


class Jobs:
    """A fork server of training jobs (see ``tests/lineage_jobs.py``)."""

    def __init__(self, root: Path) -> None:
        self.root, self.count = root, 0
        self.server = subprocess.Popen(
            [sys.executable, "-m", "tests.lineage_jobs"],
            cwd=ROOT,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": pythonpath()},
        )

    def spec(self, log_dir: Path, **job: Any) -> dict[str, Any]:
        """The whole job: its settings over the defaults, and a fresh ``out`` folder."""
        self.count += 1
        job = {
            "log_dir": str(log_dir),
            "out": str(self.root / "out" / str(self.count)),
            "val": True,
            "optimizer": ADAMW,
            "n": 72,
            **job,
        }
        job["run"] = {**BASE, **job.get("run", {})}
        return job

    def run(self, log_dir: Path, **job: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run one job in a fresh child: (how it ended, what it wrote)."""
        job = self.spec(log_dir, **job)
        out = Path(job["out"])
        assert self.server.stdin is not None and self.server.stdout is not None
        self.server.stdin.write(json.dumps(job) + "\n")
        self.server.stdin.flush()
        ended = json.loads(self.server.stdout.readline())
        result = out / "result.json"
        written = json.loads(result.read_text()) if result.exists() else {}
        if written.get("global_step") is not None:
            written["weights"] = torch.load(out / "weights.pt", weights_only=True)
        return ended, written

    def ops(self) -> list[str]:
        """The filesystem operations the last job began, one line each: ``N kind path...``."""
        return (self.root / "out" / str(self.count) / "ops.log").read_text().splitlines()

    def close(self) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()
        self.server.wait(timeout=60)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    server = Jobs(tmp_path_factory.mktemp("jobs"))
    yield server
    server.close()


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def records(result: dict[str, Any], event: str) -> list[dict[str, Any]]:
    lines = (Path(result["run_dir"]) / "events.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def valid(directory: Path) -> list[Path]:
    """Every checkpoint-named entry of ``directory``, each verified (a failure raises)."""
    store = CheckpointStore(directory, keep_last_n=1)
    for path in store.committed():
        store.verify(path)
    return store.committed()


def assert_last_resolves(directory: Path) -> None:
    link = directory / "last"
    if link.is_symlink():
        CheckpointStore(directory, keep_last_n=1).verify(followed(link))


# -- a kill at every filesystem operation of every commit --------------------------------------
def check_kill_at(
    jobs: Jobs,
    root: Path,
    at: int,
    reference: dict[str, Any],
    *,
    modes: tuple[str | None, ...],
    no_exchange: bool = False,
) -> None:
    killed = root / f"killed-{at}"
    ended, _ = jobs.run(killed, kill_at_op=at, no_exchange=no_exchange, run={"resume": "auto"})
    assert ended["signal"] == 9, f"op {at}: the job was not killed there ({ended})"
    directory = killed / CHECKPOINTS
    ops = jobs.ops()
    published = any(" rename " in op and ".staging-" in op for op in ops[:-1])
    if no_exchange:  # between a replace's two renames the checkpoint is aside until a start
        directory = root / f"swept-{at}"
        shutil.copytree(killed / CHECKPOINTS, directory, symlinks=True)
        CheckpointStore(directory, keep_last_n=1).sweep()
    # Right after the kill: no name holds a partial checkpoint, the newest one is valid.
    assert not published or valid(directory), f"op {at} ({ops[-1]}): no valid checkpoint left"
    assert_last_resolves(directory)
    for mode in modes:
        restarted = root / f"restart-{at}-{mode}"
        shutil.copytree(killed, restarted, symlinks=True)
        before = {p.name for p in valid(restarted / CHECKPOINTS)}
        ended, result = jobs.run(restarted, no_exchange=no_exchange, run={"resume": mode})
        assert ended["code"] == 0 and "error" not in result, (at, mode, result)
        directory = restarted / CHECKPOINTS
        left = sorted(p.name for p in directory.iterdir() if p.name.startswith("."))
        assert not left, f"op {at}, resume={mode}: not swept: {left}"
        assert_last_resolves(directory)
        kept = valid(directory)
        for lineage in {CheckpointStore.lineage_of(p) for p in kept}:
            members = [p for p in kept if CheckpointStore.lineage_of(p) == lineage]
            assert len(members) <= BASE["keep_last_n"] + BASE["save_top_k"], (at, mode, kept)
        if mode is None:  # a new lineage: the old one is left as it was (put back if set aside)
            assert before <= {p.name for p in kept}, (at, before, kept)
        # Continued, or started over (its run had finished): the weights of a run never killed.
        assert same_weights(result["weights"], reference["weights"]), (at, mode)


@pytest.mark.slow
def test_a_kill_at_every_filesystem_operation_of_every_commit_loses_nothing(
    jobs: Jobs, tmp_path: Path
) -> None:
    """Steps, an epoch's end that rewrites its step's checkpoint in place, best and top-k
    checkpoints entering and leaving, ``last`` moving and pruning: SIGKILL right before the
    Nth rename, replace, link, unlink, removal or swap in the checkpoint directory, for
    every N; then a restart under each ``resume`` setting."""
    ended, reference = jobs.run(tmp_path / "reference", run={"resume": "auto"})
    assert ended["code"] == 0 and reference["global_step"] == 18
    kinds = {op.split()[1] for op in jobs.ops()}
    assert {"rename", "exchange", "replace", "symlink", "rmtree", "unlink", "rmdir"} <= kinds
    for at in range(1, reference["ops"] + 1):
        check_kill_at(jobs, tmp_path, at, reference, modes=(None, "auto", "strict"))


@pytest.mark.slow
def test_without_an_atomic_swap_a_kill_between_the_renames_of_a_replace_is_put_back(
    jobs: Jobs, tmp_path: Path
) -> None:
    """A file system that cannot swap two directories: the replace renames the old
    checkpoint aside, then the new one in; the next start puts the old one back."""
    ended, reference = jobs.run(tmp_path / "reference", no_exchange=True, run={"resume": "auto"})
    assert ended["code"] == 0
    ops = jobs.ops()
    aside = [i for i, op in enumerate(ops, 1) if " rename " in op and ".replaced-" in op]
    assert aside and not any(" exchange " in op for op in ops)
    # Each replace: the old one renamed aside, the new one in, the old one's removal.
    for at in sorted({at + offset for at in aside for offset in (0, 1, 2)}):
        check_kill_at(jobs, tmp_path, at, reference, modes=("auto",), no_exchange=True)


# -- retention over restarts -------------------------------------------------------------------
@pytest.mark.slow
def test_a_hundred_kills_and_restarts_keep_the_same_checkpoints_and_weights(
    jobs: Jobs, tmp_path: Path
) -> None:
    settings = {"run": {"resume": "auto", "checkpoint_every_n_steps": 1, "keep_last_n": 2}}
    long = {"max_epochs": 30, "n": 64, **settings}
    _, reference = jobs.run(tmp_path / "reference", **long)
    assert reference["global_step"] == 240
    log_dir, directory = tmp_path / "killed", tmp_path / "killed" / CHECKPOINTS
    chooser = random.Random(0)
    for cycle in range(100):
        ended, _ = jobs.run(log_dir, kill_at_forward=chooser.randint(1, 4), **long)
        assert ended["signal"] == 9, cycle
        kept = valid(directory)
        assert len(kept) <= 2 + 2, (cycle, [p.name for p in kept])
        assert_last_resolves(directory)
    ended, result = jobs.run(log_dir, **long)
    assert result["global_step"] == 240
    assert len(valid(directory)) <= 2 + 2 and (directory / "last").is_symlink()
    assert same_weights(result["weights"], reference["weights"])


# -- settings: honoured or refused, never reverted ---------------------------------------------
@pytest.mark.parametrize(
    ("before", "after", "named"),
    [
        (ADAMW, {**ADAMW, "weight_decay": 0.3}, "weight_decay (checkpoint 0.01, now 0.3)"),
        (
            {"name": "SGD", "lr": 0.05, "momentum": 0.9},
            {"name": "SGD", "lr": 0.05, "momentum": 0.0},
            "momentum (checkpoint 0.9, now 0.0)",
        ),
    ],
)
def test_a_changed_optimizer_setting_starts_a_new_run_or_is_refused_never_reverted(
    jobs: Jobs, tmp_path: Path, before: dict[str, Any], after: dict[str, Any], named: str
) -> None:
    ended, _ = jobs.run(tmp_path, optimizer=before, kill_at_forward=20, run={"resume": "auto"})
    assert ended["signal"] == 9
    _, strict = jobs.run(tmp_path, optimizer=after, run={"resume": "strict"})
    assert strict["error"] == "IncompatibleCheckpointError" and named in strict["message"]
    _, auto = jobs.run(tmp_path, optimizer=after, run={"resume": "auto"})
    (fresh,) = records(auto, "fresh_start")
    assert fresh["reason"] == "incompatible" and named in fresh["detail"]
    assert not records(auto, "resumed") and auto["global_step"] == 18
    key = named.split(maxsplit=1)[0]
    assert auto["param_groups"][0][key] == after[key]
    config = json.loads((Path(auto["run_dir"]) / "config.json").read_text())
    assert config["resolved"]["optimizer_defaults"][key] == after[key]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"run": {"seed": 1}}, "seed (checkpoint 0, now 1)"),
        ({"n": 70}, "dataset_length (checkpoint 72, now 70)"),  # still 9 batches of 8
    ],
)
def test_a_changed_seed_or_dataset_length_is_not_resumed_silently(
    jobs: Jobs, tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    ended, _ = jobs.run(tmp_path, kill_at_forward=20, run={"resume": "auto"})
    assert ended["signal"] == 9
    changed = {**change, "run": {"resume": "strict", **change.get("run", {})}}
    _, strict = jobs.run(tmp_path, **changed)
    assert strict["error"] == "IncompatibleCheckpointError" and named in strict["message"]
    changed["run"]["resume"] = "auto"
    _, auto = jobs.run(tmp_path, **changed)
    (fresh,) = records(auto, "fresh_start")
    assert named in fresh["detail"] and auto["global_step"] == 18


# -- which lineage resume="auto" takes ---------------------------------------------------------
def test_auto_continues_its_own_lineage_past_a_newer_incompatible_one(
    jobs: Jobs, tmp_path: Path
) -> None:
    _, reference = jobs.run(tmp_path / "reference", run={"resume": "auto"})
    ended, _ = jobs.run(tmp_path, kill_at_forward=20, run={"resume": "auto"})
    assert ended["signal"] == 9
    _, other = jobs.run(tmp_path, batch_size=16, run={"resume": "auto"})  # script B
    assert other["global_step"] == 10 and not records(other, "resumed")
    _, again = jobs.run(tmp_path, run={"resume": "auto"})  # script A, again
    (resumed,) = records(again, "resumed")
    assert resumed["step"] > 0 and not resumed["branched"]
    (passed,) = resumed["passed_over"]
    assert (
        passed["reason"] == "incompatible"
        and "batch_size (checkpoint 16, now 8)" in (passed["detail"])
    )
    assert same_weights(again["weights"], reference["weights"])
    names = {p.name for p in valid(tmp_path / CHECKPOINTS)}
    assert any(other["run_dir"].endswith(name.split("-", 2)[2]) for name in names)  # B kept


def test_a_resume_from_an_older_checkpoint_branches_and_leaves_its_lineage_alone(
    jobs: Jobs, tmp_path: Path
) -> None:
    jobs.run(tmp_path, run={"resume": "auto", "keep_last_n": 3, "save_top_k": None})
    directory = tmp_path / CHECKPOINTS
    lineage = [p.name for p in valid(directory)]
    older = directory / lineage[-1]
    _, branch = jobs.run(
        tmp_path, max_epochs=3, run={"resume": str(older), "keep_last_n": 1, "save_top_k": None}
    )
    (resumed,) = records(branch, "resumed")
    assert resumed["branched"] and resumed["lineage"] != lineage[0].split("-", 2)[2]
    assert set(lineage) <= {p.name for p in valid(directory)}  # the old lineage untouched


def test_a_run_that_stopped_early_is_finished_and_resuming_it_trains_nothing(
    jobs: Jobs, tmp_path: Path
) -> None:
    """A learning rate of 0: the validation loss never improves, patience 1 stops it."""
    frozen = {"name": "SGD", "lr": 0.0}
    stop = {"early_stopping_patience": 1, "save_top_k": None}
    _, first = jobs.run(tmp_path, max_epochs=5, optimizer=frozen, run={"resume": "auto", **stop})
    assert first["stopped_early"] and first["epochs_completed"] == 2
    _, strict = jobs.run(tmp_path, max_epochs=5, optimizer=frozen, run={"resume": "strict", **stop})
    (resumed,) = records(strict, "resumed")
    assert resumed["step"] == first["global_step"] == strict["global_step"]
    assert strict["epochs_completed"] == 2 and not records(strict, "train_step")
    _, auto = jobs.run(tmp_path, max_epochs=5, optimizer=frozen, run={"resume": "auto", **stop})
    (fresh,) = records(auto, "fresh_start")
    assert fresh["reason"] == "finished" and "stopped early" in fresh["detail"]


# -- order without the wall clock --------------------------------------------------------------
def test_a_wall_clock_stepped_back_between_runs_loses_no_checkpoint(
    jobs: Jobs, tmp_path: Path
) -> None:
    """Run 1's clock is 10 minutes ahead (cancelled at its 15th forward), run 2's is right
    (cancelled at its 8th): run 2's checkpoints stay the newest of the lineage, and run 3
    continues from run 2's stop checkpoint to the weights of a run never stopped."""
    every = {"resume": "auto", "checkpoint_every_n_steps": 1, "keep_last_n": 2}
    every |= {"save_top_k": None, "save_last": False}
    _, reference = jobs.run(tmp_path / "reference", max_epochs=3, run=every)
    _, first = jobs.run(tmp_path, max_epochs=3, clock_offset_s=600, cancel_at_forward=15, run=every)
    _, second = jobs.run(tmp_path, max_epochs=3, cancel_at_forward=8, run=every)
    assert first["cancelled"] and second["cancelled"]
    (resumed,) = records(second, "resumed")
    assert resumed["path"] == records(first, "checkpoint")[-1]["path"]
    written = [r["path"] for r in records(second, "checkpoint")]
    assert len(written) >= 3 and all(Path(path).is_dir() for path in written[-2:]), written
    _, third = jobs.run(tmp_path, max_epochs=3, run=every)
    (resumed,) = records(third, "resumed")
    assert resumed["path"] == written[-1] and not resumed["branched"]
    assert third["global_step"] == reference["global_step"] == 27
    assert same_weights(third["weights"], reference["weights"])


# -- one writer per lineage --------------------------------------------------------------------
def test_a_lineage_held_by_a_live_run_is_branched_from_or_refused(
    jobs: Jobs, tmp_path: Path
) -> None:
    """A (this process) continues a lineage and holds it, paused at its first forward; a
    second run in another process branches from it under "auto", and is refused naming A's
    pid and host under "strict". Both train to the end, each keeping its own best."""
    ended, _ = jobs.run(tmp_path, kill_at_forward=20, run={"resume": "auto"})
    assert ended["signal"] == 9
    model, paused, go = make_model(), threading.Event(), threading.Event()
    at_forward(model, 1, lambda: (paused.set(), go.wait(60)))
    holder = build(jobs.spec(tmp_path, run={"resume": "auto"}), model)

    async def both() -> tuple[Any, dict[str, Any], dict[str, Any]]:
        task = asyncio.create_task(holder.train())
        try:
            assert await asyncio.to_thread(paused.wait, 60)
            _, strict = await asyncio.to_thread(jobs.run, tmp_path, run={"resume": "strict"})
            _, branch = await asyncio.to_thread(jobs.run, tmp_path, run={"resume": "auto"})
        finally:
            go.set()
        return await task, strict, branch

    results, strict, branch = asyncio.run(both())
    named = f"run {holder.run_dir.name} (pid {os.getpid()} on host {socket.gethostname()})"
    assert strict["error"] == "LineageHeldError" and named in strict["message"], strict
    (resumed,) = records(branch, "resumed")
    assert resumed["branched"] and named in resumed["branch_reason"], resumed
    (held,) = records({"run_dir": results.run_dir}, "resumed")
    assert not held["branched"] and resumed["lineage"] != held["lineage"]
    assert results.global_step == branch["global_step"] == 18
    assert Path(results.best_checkpoint).is_dir() and Path(branch["best_checkpoint"]).is_dir()
    directory = tmp_path / CHECKPOINTS
    kept = valid(directory)
    for lineage in {CheckpointStore.lineage_of(p) for p in kept}:
        members = [p for p in kept if CheckpointStore.lineage_of(p) == lineage]
        assert len(members) <= BASE["keep_last_n"] + BASE["save_top_k"], kept
    assert not list(directory.glob(".lineage-*"))  # every lock let go, its file removed
