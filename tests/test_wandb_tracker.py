"""WandbLogger writes an offline W&B run: its ``.wandb`` file, read back record by record with
wandb's own protobuf ``Record``, holds the config, the history at the optimizer steps, the
saved files and how the run ended. Nothing here reaches the network: there are no
credentials, so the default mode is offline."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from torch.utils.data import DataLoader

from core import WandbLogger, create_optimized_training_optimizer
from core.callbacks import Callback, Record, RunInfo
from core.errors import ConfigError, TrainingStepError
from core.trackers import TrackerUnavailableError
from core.trackers.wandb import _auto_mode
from tests.helpers import ROOT, loaders, make_classification, make_model, pythonpath
from tests.test_error_handler import FailsAtCall
from tests.test_trackers import FakeRun, records, write_reports

_BLOCK, _HEADER = 32768, 7  # W&B's LevelDB-style log: 32 KiB blocks, 7-byte chunk headers
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(run_path: Path) -> list[Any]:
    """Every record of the run's ``run-<id>.wandb`` log (the format ``wandb sync`` reads:
    a ``:W&B`` file header, then CRC-checked chunks of protobuf ``Record`` messages)."""
    from wandb.proto.wandb_internal_pb2 import Record as WandbRecord

    (log,) = run_path.glob("run-*.wandb")
    data = log.read_bytes()
    assert struct.unpack("<4sHB", data[:_HEADER])[:2] == (b":W&B", 0xBEE1)
    found, pending, pos = [], b"", _HEADER
    while pos + _HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _HEADER:  # a block's tail too short for a header: padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        chunk, pos = data[pos + _HEADER : pos + _HEADER + length], pos + _HEADER + length
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            record = WandbRecord()
            record.ParseFromString(pending)
            found.append(record)
    return found


def key(item: Any) -> str:
    """The name of a config, history or summary item (``key``, or ``nested_key`` parts)."""
    return str(item.key) or ".".join(item.nested_key)


@dataclass
class WandbRun:
    """What a test reads of an offline run."""

    records: list[Any]

    def of(self, kind: str) -> list[Any]:
        return [getattr(r, kind) for r in self.records if r.WhichOneof("record_type") == kind]

    def config(self) -> dict[str, Any]:
        items = [u for run in self.of("run") for u in run.config.update]
        items += [u for config in self.of("config") for u in config.update]
        return {key(u): json.loads(u.value_json) for u in items}

    def history(self, name: str) -> list[tuple[int, float]]:
        rows = [{key(i): json.loads(i.value_json) for i in h.item} for h in self.of("history")]
        return [(row["_step"], row[name]) for row in rows if name in row]

    def summary(self, name: str) -> Any:
        values = [
            json.loads(u.value_json) for s in self.of("summary") for u in s.update if key(u) == name
        ]
        return values[-1]

    def files(self) -> set[str]:
        return {f.path for files in self.of("files") for f in files.files}

    def exit_code(self) -> int:
        (exit_record,) = self.of("exit")
        return int(exit_record.exit_code)


def read_run(tracker: WandbLogger) -> WandbRun:
    assert tracker.path is not None
    return WandbRun(wandb_records(tracker.path))


def wandb_services() -> list[str]:
    """wandb's service processes (``wandb-core`` and its monitor) this process started."""
    return [p.name() for p in psutil.Process().children(recursive=True) if "wandb" in p.name()]


@pytest.fixture(scope="module", autouse=True)
def no_credentials(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No API key, no netrc, wandb's own files in a temporary home; wandb's settings are
    reloaded (torn down) before and after so these hold."""
    import wandb

    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
            patch.delenv(name, raising=False)
        patch.setenv("NETRC", str(home / "netrc"))  # absent: no login
        for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            patch.setenv(name, str(home / name.lower()))
        wandb.teardown()
        yield
        wandb.teardown()


@dataclass
class Tracked:
    run_dir: Path
    events: list[dict[str, Any]]
    tracker: WandbLogger

    def of(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.events if r["event"] == event]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> Tracked:
    """One real 2-epoch run (8 steps) with a default WandbLogger."""
    log_dir = tmp_path_factory.mktemp("wandb") / "logs"
    tracker = WandbLogger()
    train, val = loaders(n=128)
    job = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=train,
        val_loader=val,
        log_dir=log_dir,
        max_epochs=2,
        progress=False,
        callbacks=[tracker],
    )
    results = anyio.run(job.train)
    lines = (results.run_dir / "events.jsonl").read_text().splitlines()
    return Tracked(results.run_dir, [json.loads(line) for line in lines], tracker)


@pytest.mark.slow
def test_the_offline_run_holds_the_config_history_files_and_a_clean_exit(
    tracked: Tracked,
) -> None:
    tracker = tracked.tracker
    assert tracker.mode == "offline"  # no credentials
    assert tracker.path is not None and tracker.path.parent == tracked.run_dir / "wandb"
    assert tracker.path.name.endswith(f"-{tracker.run_id}")
    run = read_run(tracker)
    (opened,) = run.of("run")
    assert opened.project == "experiment" and opened.display_name == tracked.run_dir.name
    config = run.config()
    assert config["run"]["max_epochs"] == 2 and config["optim"]["learning_rate"] == 0.001
    assert config["core"]["run_id"] == tracked.run_dir.name
    steps = tracked.of("train_step")
    assert len(steps) == 8
    assert run.history("train/loss") == [(s["step"], s["loss"]) for s in steps]
    assert run.history("epoch")[0] == (1, 0)
    validations = tracked.of("validation")
    assert run.history("val/loss") == [(v["step"], v["val_loss"]) for v in validations]
    assert [step for step, _ in run.history("val/accuracy")] == [4, 8]
    assert run.history("epoch/train_loss") == [
        (e["step"], e["train_loss"]) for e in tracked.of("epoch_end")
    ]
    assert {"model_summary.md", "performance_summary.txt"} <= run.files()
    assert "| name | class |" in (tracker.path / "files" / "model_summary.md").read_text()
    assert run.summary("status") == "FINISHED" and run.exit_code() == 0
    assert wandb_services() == []  # the service stopped with the process's last wandb run
    sync = subprocess.run(
        [sys.executable, "-m", "wandb", "sync", "--dry-run", str(tracker.path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Would sync 1 run(s)" in sync.stderr + sync.stdout, sync.stderr  # the later upload


class Started(Callback):
    """Sets ``stepped`` at the run's first optimizer step."""

    def __init__(self) -> None:
        self.stepped = asyncio.Event()

    async def on_record(self, run: RunInfo, record: Record) -> None:
        if record.get("event") == "train_step":
            self.stepped.set()


@pytest.mark.slow
def test_a_failed_run_exits_non_zero_and_a_cancelled_one_is_killed(tmp_path: Path) -> None:
    failing = WandbLogger(project="faults")
    job = create_optimized_training_optimizer(
        model=FailsAtCall(call=3),
        train_loader=DataLoader(make_classification(64), batch_size=16),
        log_dir=tmp_path / "failed",
        max_epochs=1,
        progress=False,
        callbacks=[failing],
    )
    with pytest.raises(TrainingStepError):
        anyio.run(job.train)
    failed = read_run(failing)
    assert failed.exit_code() == 1 and failed.summary("status") == "FAILED"
    assert [step for step, _ in failed.history("train/loss")] == [1, 2]

    cancelled, started = WandbLogger(project="faults"), Started()
    train, _ = loaders(n=4096, batch_size=8)
    job = create_optimized_training_optimizer(
        model=make_model(),
        train_loader=train,
        log_dir=tmp_path / "cancelled",
        max_epochs=50,
        progress=False,
        callbacks=[cancelled, started],
    )

    async def cancel_after_a_step() -> None:
        task = asyncio.ensure_future(job.train())
        await started.stepped.wait()
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancel_after_a_step())
    killed = read_run(cancelled)
    assert killed.exit_code() == 255 and killed.summary("status") == "KILLED"
    assert killed.history("train/loss")  # what ran before the cancel is kept


@pytest.mark.anyio
async def test_two_runs_at_once_and_a_reused_tracker_and_the_service_ends_with_the_last(
    tmp_path: Path,
) -> None:
    first = WandbLogger(tags=["a"], group="g", init_kwargs={"notes": "by hand"})
    second = WandbLogger(dir=tmp_path / "elsewhere", rank_zero_only=False)  # every rank tracks
    run_a, run_b = FakeRun(run_dir=tmp_path / "a"), FakeRun(tmp_path / "b", rank=1, world_size=2)
    write_reports(tmp_path / "a")
    start_a, *steps_a, end_a = records("a")
    start_b, *steps_b, end_b = records("b")
    for record in (start_a, steps_a[0]):
        await first.on_record(run_a, record)
    await second.on_record(run_b, start_b)  # both open
    for record in (*steps_a[1:], end_a):
        await first.on_record(run_a, record)
    await first.on_run_closed(run_a)
    assert "wandb-core" in wandb_services()  # the second run is still open
    for record in (*steps_b, end_b):
        await second.on_record(run_b, record)
    await second.on_run_closed(run_b)
    assert wandb_services() == []
    a, b = read_run(first), read_run(second)
    assert a.history("train/loss") == b.history("train/loss") == [(1, 1.0), (2, 0.5), (3, 1 / 3)]
    assert a.exit_code() == b.exit_code() == 0
    (opened_a,), (opened_b,) = a.of("run"), b.of("run")
    assert (opened_a.tags, opened_a.run_group, opened_a.notes) == (["a"], "g", "by hand")
    assert (opened_b.display_name, opened_b.run_group) == ("b-rank1", "b")  # ranks grouped
    assert {"training_metrics.png", "performance_summary.txt"} <= a.files()
    assert first.path is not None
    copied = first.path / "files" / "training_metrics.png"
    assert copied.read_bytes() == (tmp_path / "a" / "training_metrics.png").read_bytes()
    assert second.path is not None and second.path.parents[1] == tmp_path / "elsewhere"
    earlier = first.run_id
    for record in records("c"):  # the same tracker, a new run: a new wandb run
        await first.on_record(FakeRun(run_dir=tmp_path / "c"), record)
    await first.on_run_closed(FakeRun(run_dir=tmp_path / "c"))
    assert first.run_id != earlier and read_run(first).of("run")[0].display_name == "c"


@pytest.mark.anyio
async def test_a_disabled_run_writes_nothing(tmp_path: Path) -> None:
    tracker, run = WandbLogger(mode="disabled"), FakeRun(run_dir=tmp_path / "r1")
    write_reports(tmp_path / "r1")
    for record in records():
        await tracker.on_record(run, record)
    await tracker.on_run_closed(run)
    assert tracker.mode == "disabled" and tracker.path is None
    assert not (tmp_path / "r1" / "wandb").exists()


def test_the_default_mode_is_online_only_with_credentials(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import wandb

    assert _auto_mode(wandb) == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # never sent: no run is opened
    monkeypatch.setenv("WANDB_SILENT", "true")  # no "logged in as" lookup
    wandb.teardown()  # wandb reads its environment once per setup
    assert _auto_mode(wandb) == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    wandb.teardown()
    assert _auto_mode(wandb) == "disabled"
    monkeypatch.undo()
    wandb.teardown()


def test_bad_arguments_and_a_missing_wandb_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"^mode='cloud' is invalid; allowed: None .*'offline'"):
        WandbLogger(mode="cloud")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^tags='baseline' is invalid"):
        WandbLogger(tags="baseline")
    with pytest.raises(ConfigError, match=r"^project='' is invalid"):
        WandbLogger(project="")
    with pytest.raises(ConfigError, match=r"Fix: pass dir as WandbLogger's own argument"):
        WandbLogger(init_kwargs={"dir": "runs"})
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails
    hint = r"pip install -e '\.\[trackers\]' in core's checkout"
    with pytest.raises(TrackerUnavailableError, match=hint):
        WandbLogger()


@pytest.mark.processes
def test_importing_core_does_not_import_wandb() -> None:
    check = "import sys, core; assert 'wandb' not in sys.modules, 'wandb was imported'"
    result = subprocess.run(
        [sys.executable, "-c", check],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": pythonpath()},
    )
    assert result.returncode == 0, result.stderr
