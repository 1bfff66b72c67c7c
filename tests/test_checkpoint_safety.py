"""Checkpoints as untrusted files, shared by several runs, on disks that fill up.

Tampered manifests are rejected before any byte is loaded; a checkpoint another version of
core wrote is passed over by ``resume="auto"`` and refused clearly by ``"strict"``; runs of
one experiment never clobber, prune or sweep each other's checkpoints and ``resume="auto"``
follows the run that committed last; a full disk under the checkpoints or the log says
where, why, and which checkpoint is still good (a real tmpfs: skipped where it cannot be
mounted).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from torch.utils.data import DataLoader

from core import CheckpointError, IncompatibleCheckpointError, create_optimized_training_optimizer
from core.checkpointing.manifest import hash_file
from core.checkpointing.store import CheckpointStore
from tests.helpers import make_classification, make_model


def commit(store: CheckpointStore, step: int) -> Path:
    staging = store.stage(step)
    store.write_state(staging, {"step": step, "weights": torch.arange(4.0)})
    return store.commit(staging, step, {"epoch": 0, "reason": "test"})


def rewrite_manifest(checkpoint: Path, change: Any) -> None:
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    change(manifest)
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


# Tampered manifests (item 5) -----------------------------------------------------------
def _extra_key(m: dict[str, Any]) -> None:
    m["trusted"] = True


def _missing_key(m: dict[str, Any]) -> None:
    del m["run_id"]


def _hash_not_a_string(m: dict[str, Any]) -> None:
    m["files"]["state.pt"]["sha256"] = 12345


def _parent_path(m: dict[str, Any]) -> None:
    m["files"]["../outside.pt"] = m["files"].pop("state.pt")


def _absolute_path(m: dict[str, Any]) -> None:
    m["files"]["/etc/passwd"] = m["files"].pop("state.pt")


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (_extra_key, r"unexpected \['trusted'\]"),
        (_missing_key, r"missing \['run_id'\]"),
        (_hash_not_a_string, r"sha256 of state.pt is 12345"),
        (_parent_path, r"'../outside.pt' points outside the checkpoint"),
        (_absolute_path, r"'/etc/passwd' points outside the checkpoint"),
    ],
)
def test_a_malformed_manifest_is_rejected(tmp_path: Path, change: Any, pattern: str) -> None:
    store = CheckpointStore(tmp_path, keep_last_n=3)
    checkpoint = commit(store, 1)
    rewrite_manifest(checkpoint, change)
    with pytest.raises(CheckpointError, match=pattern):
        store.verify(checkpoint)


def test_an_unlisted_file_is_rejected_even_with_a_recomputed_manifest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last_n=3)
    checkpoint = commit(store, 1)
    torch.save({"weights": torch.full((4,), 666.0)}, checkpoint / "sharded.pt")
    with pytest.raises(CheckpointError, match=r"sharded.pt is present but not in the manifest"):
        store.verify(checkpoint)


def test_a_symlink_is_rejected(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep_last_n=3)
    checkpoint = commit(store, 1)
    outside = tmp_path / "elsewhere.pt"
    (checkpoint / "state.pt").rename(outside)
    (checkpoint / "state.pt").symlink_to(outside)  # same bytes, same hash: still refused
    with pytest.raises(CheckpointError, match=r"state.pt is a symlink"):
        store.verify(checkpoint)


def test_a_4_gib_sparse_file_fails_on_its_size_before_any_hashing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last_n=3)
    checkpoint = commit(store, 1)
    with (checkpoint / "state.pt").open("r+b") as handle:
        handle.truncate(4 * 2**30)  # sparse: no block written
    with pytest.raises(CheckpointError, match=r"state.pt has 4294967296 bytes, the manifest says"):
        store.verify(checkpoint)


def build(root: Path, **kwargs: Any) -> Any:
    return create_optimized_training_optimizer(
        model=make_model(),
        train_loader=DataLoader(make_classification(96), batch_size=16),
        max_epochs=kwargs.pop("max_epochs", 3),
        log_dir=root / "logs",
        checkpoint_dir=root / "checkpoints",
        experiment_name="shared",
        **kwargs,
    )


def events(optimizer: Any) -> list[dict[str, Any]]:
    lines = (optimizer.run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def test_resume_auto_skips_a_tampered_newest_checkpoint_with_an_error(tmp_path: Path) -> None:
    first = build(tmp_path)
    anyio.run(first.train)
    newest, previous = [c.path for c in first.checkpoints][:2]
    rewrite_manifest(newest, _extra_key)
    resumed = build(tmp_path, resume="auto", max_epochs=4)
    anyio.run(resumed.train)
    records = events(resumed)
    (error,) = [r for r in records if r["event"] == "error"]
    assert error["kind"] == "checkpoint_invalid" and error["path"] == str(newest)
    assert next(r for r in records if r["event"] == "resumed")["path"] == str(previous)


# Checkpoints this version of core cannot read ------------------------------------------
def rewrite_state(checkpoint: Path, change: Any) -> None:
    """Change ``state.pt`` and rehash the manifest, as another writer would."""
    state = checkpoint / "state.pt"
    payload = torch.load(state, weights_only=True)
    change(payload)
    torch.save(payload, state)
    entry = {"sha256": hash_file(state), "bytes": state.stat().st_size}
    rewrite_manifest(checkpoint, lambda m: m["files"].update({"state.pt": entry}))


def _newer_format(checkpoints: list[Path]) -> None:
    rewrite_state(checkpoints[0], lambda state: state.update(format=2))


def _no_fingerprint(checkpoints: list[Path]) -> None:
    rewrite_state(checkpoints[0], lambda state: state.pop("fingerprint"))


def _older_manifests(checkpoints: list[Path]) -> None:
    for checkpoint in checkpoints:
        rewrite_manifest(checkpoint, lambda m: m.update(manifest_version=1))


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (
            _newer_format,
            "its state has checkpoint format 2, and this version of core reads format 1",
        ),
        (_no_fingerprint, "its state.pt has no 'fingerprint'"),
        (_older_manifests, "manifest_version 1, and this version of core reads manifest_version 2"),
    ],
    ids=["format 2", "no fingerprint", "manifest_version 1"],
)
def test_a_checkpoint_this_version_cannot_read_is_passed_over_or_refused_clearly(
    tmp_path: Path, damage: Any, said: str
) -> None:
    first = build(tmp_path, max_epochs=1)
    anyio.run(first.train)
    damage([c.path for c in first.checkpoints])
    strict = build(tmp_path, resume="strict")
    with pytest.raises(IncompatibleCheckpointError, match=re.escape(said) + ".* Fix: "):
        anyio.run(strict.train)
    auto = build(tmp_path, resume="auto")
    anyio.run(auto.train)
    (fresh,) = [r for r in events(auto) if r["event"] == "fresh_start"]
    assert fresh["reason"] == "unreadable" and said in fresh["detail"], fresh
    assert [passed["reason"] for passed in fresh["passed_over"]] == ["unreadable"]
    assert auto.global_step == 18


# Runs that share an experiment (item 3) ------------------------------------------------
def owners(store: CheckpointStore) -> list[tuple[int, str]]:
    return [(store.verify(p)["step"], store.verify(p)["run_id"]) for p in store.committed()]


def test_two_runs_at_once_in_one_process_keep_their_own_checkpoints(tmp_path: Path) -> None:
    a = build(tmp_path, checkpoint_every_n_steps=1, keep_last_n=3, seed=1)
    b = build(tmp_path, checkpoint_every_n_steps=1, keep_last_n=3, seed=2)

    async def both() -> None:
        await asyncio.gather(a.train(), b.train())

    asyncio.run(both())
    store = a._built.checkpointer.store
    found = owners(store)  # every one verifies
    for run in (a, b):
        mine = sorted(step for step, owner in found if owner == run.run_dir.name)
        assert mine == [16, 17, 18]  # its own last three, none pruned or taken by the other
    assert not [p for p in store.directory.iterdir() if ".staging-" in p.name]
    for run in (a, b):  # every step record matches its own checkpoint
        saved = [r for r in events(run) if r["event"] == "checkpoint"]
        assert all(run.run_dir.name in r["path"] for r in saved)


def test_a_resumed_branch_never_overwrites_the_newer_one_and_auto_follows_it(
    tmp_path: Path,
) -> None:
    first = build(tmp_path, keep_last_n=5)
    anyio.run(first.train)  # steps 6, 12, 18
    store = first._built.checkpointer.store
    at_6 = next(p for p in store.committed() if store.verify(p)["step"] == 6)
    branch = build(tmp_path, resume=str(at_6), max_epochs=2, keep_last_n=5)
    anyio.run(branch.train)  # from 6 to 12 again, on its own branch
    steps = owners(store)
    assert (12, first.run_dir.name) in steps and (12, branch.run_dir.name) in steps
    assert (18, first.run_dir.name) in steps  # the newer step of the older branch is kept
    newest = store.committed()[0]
    assert store.verify(newest)["run_id"] == branch.run_dir.name
    assert store.verify(newest)["parent"] == at_6.name  # its lineage
    later = build(tmp_path, resume="auto", max_epochs=3)
    anyio.run(later.train)
    resumed = next(r for r in events(later) if r["event"] == "resumed")
    assert resumed["path"] == str(newest) and resumed["step"] == 12  # commit order, not step


def test_a_new_run_is_not_pruned_against_an_older_runs_higher_steps(tmp_path: Path) -> None:
    old = build(tmp_path, keep_last_n=2)
    anyio.run(old.train)
    new = build(tmp_path, keep_last_n=2, max_epochs=1)
    anyio.run(new.train)
    store = new._built.checkpointer.store
    assert (6, new.run_dir.name) in owners(store)
    assert [s for s, o in owners(store) if o == old.run_dir.name] == [18, 12]


# Full disks (item 4) -------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (needs root and mount); skipped with the reason where impossible."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave_bytes: int) -> None:
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    try:
        (disk / "ballast").write_bytes(b"\0" * max(0, free - leave_bytes))
    except OSError as exc:  # a run writing there meanwhile filled it first: full, as asked
        if exc.errno != errno.ENOSPC or leave_bytes:
            raise


def wide_model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 2))


# How much room a checkpoint finds, in checkpoints: the write fails in different places
# (staging, torch.save's zip writer mid-file or at its end, the manifest, the rename).
ROOM = (0.0, 0.25, 0.6, 0.95, 1.5)


@pytest.mark.parametrize("room", ROOM)
def test_a_full_checkpoint_disk_names_path_space_and_last_good_checkpoint(
    tmp_path: Path, small_disk: Path, room: float
) -> None:
    optimizer = create_optimized_training_optimizer(
        model=wide_model(),
        train_loader=DataLoader(make_classification(96), batch_size=16),
        max_epochs=3,
        log_dir=tmp_path / "logs",
        checkpoint_dir=small_disk,
        checkpoint_every_n_steps=2,
        keep_last_n=1,
    )
    state_bytes = 3 * 4 * (8 * 1024 + 1024 + 1024 * 2 + 2)  # weights + two AdamW moments
    fill(small_disk, leave_bytes=int(state_bytes * room))

    with pytest.raises(CheckpointError) as raised:
        anyio.run(optimizer.train)
    message = str(raised.value)
    assert re.search(rf"cannot write .+ in {small_disk}: the disk is full", message), message
    assert re.search(r"\d+\.\d MiB free there", message), message
    assert "Fix: free space or point checkpoint_dir at a writable disk" in message
    good = optimizer.last_checkpoint
    if room > 1:
        assert good is not None and f"the last good checkpoint is {good}" in message
    else:
        assert good is None and "no checkpoint was saved" in message
    leftovers = [p.name for p in small_disk.iterdir() if ".staging-" in p.name]
    assert leftovers == []  # the partial write was removed
    store = CheckpointStore(small_disk, keep_last_n=1)
    assert store.newest_valid(lambda p, r: pytest.fail(r)) == (Path(good) if good else None)
    if good is not None:
        assert store.load_state(Path(good))["trainer"]["global_step"] == 2
    (end,) = [r for r in events(optimizer) if r["event"] == "run_end"]
    assert end["status"] == "failed" and end["last_checkpoint"] == good


def test_every_form_of_a_full_disk_reads_the_same(small_disk: Path) -> None:
    """torch.save's OSError, its zip writer's "unexpected pos" (no errno), and a distributed
    checkpoint's CheckpointException (a BaseException wrapping either) on a real full disk."""
    import torch.distributed.checkpoint as dcp

    from core.checkpointing.disk import disk_error, is_write_failure

    big = {"w": torch.randn(512, 1024)}  # 2 MiB: more than the disk holds
    failures: list[BaseException] = []
    for attempt in range(2):
        try:
            with (small_disk / f"state{attempt}.pt").open("wb") as handle:
                torch.save(big, handle)
        except BaseException as exc:
            failures.append(exc)
    try:
        with pytest.warns(UserWarning):  # no process group: DCP saves in this process
            dcp.save(big, checkpoint_id=small_disk / "sharded", no_dist=True)
    except BaseException as exc:
        failures.append(exc)
    assert any(type(f).__name__ == "CheckpointException" for f in failures), failures
    short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1259136 vs 1")
    for failure in [*failures, short]:
        assert is_write_failure(failure)
        message = disk_error(failure, small_disk, "the checkpoint of step 2", None, 0)
        start = f"cannot write the checkpoint of step 2 in {small_disk}: the disk is full"
        assert message.startswith(start) and "(0.0 MiB free there" in message, message


def test_a_full_log_disk_degrades_logging_but_checkpoints_and_events_go_on(
    tmp_path: Path, small_disk: Path
) -> None:
    optimizer = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=DataLoader(make_classification(96), batch_size=16),
        max_epochs=3,
        log_dir=small_disk,
        checkpoint_dir=tmp_path / "checkpoints",
        checkpoint_every_n_steps=2,
    )
    seen: list[dict[str, Any]] = []

    async def main() -> Any:
        async def consume() -> None:
            async for record in optimizer.events():
                seen.append(record)
                if record["event"] == "run_start":
                    fill(small_disk, leave_bytes=0)  # the disk fills during the run

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.sleep(0)
            results = await optimizer.train()
        return results  # the consumer's stream ended: the task group could close

    results = asyncio.run(main())
    assert results.global_step == 18
    degraded = [r for r in seen if r["event"] == "log_degraded"]
    assert degraded and degraded[0]["level"] == "error" and "No space left" in degraded[0]["reason"]
    assert seen[-1]["event"] == "run_end" and seen[-1]["status"] == "completed"
    saved = CheckpointStore(tmp_path / "checkpoints", keep_last_n=2).committed()
    assert len(saved) == 2 and all(hash_file(p / "state.pt") for p in saved)
