"""``devices=N`` and ``core-train fit --devices N``: the ranks started without torchrun, by
torch's own elastic launcher, give what the ``torchrun --nproc-per-node N`` command gives.

The multi-process tests run real 2-rank gloo jobs on CPU and compare them with the same job
under ``python -m torch.distributed.run``; the others check what is refused at creation.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from core import ConfigError, MultiGPUConfig, SignalReceived, load_weights
from core.cli import main
from core.distributed.devices import ranks_to_start
from core.distributed.environment import DistributedEnvironment
from core.distributed.selection import Machine, StrategyOptions, build_strategy, resolve_mode
from core.trainer.process.ranks import _kept
from tests import devices_parts, isolation_parts
from tests.helpers import pythonpath

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}
SAME = (
    "epochs_completed",
    "global_step",
    "train_loss",
    "val_loss",
    "val_accuracy",
    "best_val_loss",
    "stopped_early",
)
"""What a run computes (not where it wrote, nor how fast)."""


def torchrun_env(monkeypatch: pytest.MonkeyPatch, world_size: int) -> None:
    names = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    for name, value in names.items():
        monkeypatch.setenv(name, value)


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- refused at creation ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"devices": 0}, r"devices=0 is invalid; allowed: None or an integer >= 1"),
        ({"devices": "2x4"}, r"devices='2x4' is invalid.*torchrun --nnodes M --nproc-per-node N"),
        (
            {"devices": 2, "training_mode": "single_gpu"},
            r"training_mode='single_gpu' is invalid; allowed: "
            r"'cpu', 'auto', 'distributed', 'fsdp', 'expert_parallel' with devices=2",
        ),
        (
            {"devices": 2, "training_mode": "cpu", "backend": "nccl"},
            r"backend='nccl' is invalid; allowed: 'gloo' or None with training_mode='cpu'",
        ),
        ({"devices": 2, "world_size": 2}, r"world_size=2 is invalid; allowed: -1 with devices=2"),
        ({"devices": 2, "enable_distributed": False}, r"enable_distributed=False is invalid"),
    ],
)
def test_a_bad_devices_setting_is_refused_naming_the_field(
    settings: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        MultiGPUConfig(**settings)


def test_devices_against_the_machine_torchrun_and_process_isolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"distributed.devices=2 is invalid.*isolation='process'"):
        devices_parts.build(tmp_path, isolation="process")
    with pytest.raises(
        ConfigError,
        match=r"loss_fn=.*\(devices=2: each rank rebuilds it\).*"
        r"or run it under torchrun --nproc-per-node 2",
    ):
        devices_parts.build(tmp_path, loss_fn=lambda out, y: (out - y).sum())
    # more ranks than GPUs (a CUDA machine, faked: this one has none)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ConfigError,
        match=r"distributed.devices=3 is invalid; allowed: at most "
        r"2, the CUDA devices of this machine",
    ):
        devices_parts.build(tmp_path, devices=3)
    # training_mode='cpu' leaves the GPUs alone: not bounded by them, and each rank is a
    # gloo rank on the CPU (what a torchrun-started rank of that job builds)
    cpu_ranks = MultiGPUConfig(devices=3, training_mode="cpu")
    assert ranks_to_start(cpu_ranks) == 3
    torchrun_env(monkeypatch, 3)
    machine = Machine(DistributedEnvironment.from_environ(), cuda_count=2)
    mode, _ = resolve_mode(cpu_ranks, machine)
    rank = build_strategy(mode, cpu_ranks, machine, StrategyOptions(True, 0))
    assert (mode, rank.device, rank.backend) == ("distributed", torch.device("cpu"), "gloo")
    monkeypatch.undo()
    torchrun_env(monkeypatch, 2)  # a rank of a 2-process torchrun: devices=2 is that job
    assert ranks_to_start(MultiGPUConfig(devices=2)) is None
    with pytest.raises(
        ConfigError,
        match=r"distributed.devices=4 is invalid; allowed: 2 \(this "
        r"torchrun's --nproc-per-node\)",
    ):
        devices_parts.build(tmp_path, devices=4)


def test_the_command_line_refuses_devices_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--example", "digits", "--devices", "0"]) == 2
    assert "--devices=0 is invalid; allowed: None or an integer >= 1" in capsys.readouterr().err
    torchrun_env(monkeypatch, 2)
    assert main(["--example", "digits", "--devices", "3"]) == 2
    assert "--devices=3 is invalid; allowed: 2 (this torchrun's" in capsys.readouterr().err


# -- real ranks -------------------------------------------------------------------------------
def fit_command(log_dir: Path) -> list[str]:
    return [
        "fit",
        "--model",
        "tests.isolation_parts:make_model",
        "--data",
        "tests.devices_parts:loaders",
        "--batch-size",
        "8",
        "--epochs",
        "2",
        "--seed",
        "3",
        "--log-dir",
        str(log_dir),
        "--experiment",
        "cli",
        "--no-progress",
        "--no-reports",
        "--num-workers",
        "0",
    ]


def fitted(log_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The run's results.json and its last checkpoint's weights."""
    (found,) = (log_dir / "cli").glob("*/results.json")
    results = json.loads(found.read_text())
    model = isolation_parts.make_model()
    load_weights(results["last_checkpoint"], model)
    return results, model.state_dict()


@pytest.mark.distributed
@pytest.mark.slow
def test_fit_devices_2_gives_what_the_torchrun_command_gives(tmp_path: Path) -> None:
    ours = subprocess.run(
        [sys.executable, "-m", "core", *fit_command(tmp_path / "a"), "--devices", "2"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert ours.returncode == 0, ours.stdout[-3000:] + ours.stderr[-3000:]
    theirs = subprocess.run(
        [*TORCHRUN, "-m", "core", *fit_command(tmp_path / "b")],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert theirs.returncode == 0, theirs.stdout[-3000:] + theirs.stderr[-3000:]
    (a, a_weights), (b, b_weights) = fitted(tmp_path / "a"), fitted(tmp_path / "b")
    assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME} and a["global_step"] == 12
    assert same_weights(a_weights, b_weights)
    assert ours.stdout.count("run directory:") == 1  # rank 0 reports, once


@pytest.mark.distributed
@pytest.mark.slow
def test_devices_2_from_asyncio_returns_torchruns_results_and_loads_its_weights(
    tmp_path: Path,
) -> None:
    reference = subprocess.run(
        [*TORCHRUN, str(Path(devices_parts.__file__)), str(tmp_path)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    job = devices_parts.build(tmp_path / "api")
    seen: list[str] = []

    async def train() -> Any:
        stream = job.events()
        consumer = asyncio.create_task(_collect(stream, seen))
        results = await job.train()
        await consumer
        return results

    results = asyncio.run(train())
    expected = json.loads((tmp_path / "results.json").read_text())
    assert {k: getattr(results, k) for k in SAME} == {k: expected[k] for k in SAME}
    assert same_weights(job.model.state_dict(), torch.load(tmp_path / "weights.pt"))
    assert job.world_size == 2 and job.global_step == results.global_step == 12
    assert seen[0] == "run_start" and seen[-1] == "run_end" and "train_step" in seen
    assert job.run_dir == results.run_dir and (results.run_dir / "events.jsonl").is_file()


@pytest.mark.distributed
@pytest.mark.slow
def test_devices_2_with_training_mode_cpu_trains_two_gloo_ranks_on_the_cpu(
    tmp_path: Path,
) -> None:
    # What a user means by it, on a CUDA machine too: DDP over two CPU ranks, each training
    # half of every epoch (one process per rank alone would take 24 steps).
    job = devices_parts.build(tmp_path, training_mode="cpu")
    results = asyncio.run(job.train())
    assert job.world_size == 2 and results.global_step == 12
    (start,) = [
        json.loads(line)
        for line in (results.run_dir / "events.jsonl").read_text().splitlines()
        if '"run_start"' in line
    ]
    strategy = start["resolved"]["strategy"]
    assert (strategy["training_mode"], strategy["device"], strategy["backend"]) == (
        "distributed",
        "cpu",
        "gloo",
    )


async def _collect(stream: Any, seen: list[str]) -> None:
    async for record in stream:
        seen.append(record["event"])


@pytest.mark.distributed
@pytest.mark.slow
def test_a_cancelled_train_stops_every_rank_at_a_checkpoint(tmp_path: Path) -> None:
    job = devices_parts.build(
        tmp_path, max_epochs=50, train_loader=isolation_parts.SlowLoader(0.05)
    )
    ranks: list[psutil.Process] = []

    async def cancel() -> None:
        task = asyncio.ensure_future(job.train())
        deadline = time.monotonic() + 180
        while job.global_step < 3:
            assert not task.done() and time.monotonic() < deadline
            await asyncio.sleep(0.02)
        ranks.extend(psutil.Process(job._child.pid).children(recursive=True))
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancel())
    assert len(ranks) >= 2
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in ranks):  # the launcher's children: the ranks and their helpers
        assert time.monotonic() < deadline, [p.pid for p in ranks if _alive(p)]
        time.sleep(0.05)
    assert job.last_checkpoint is not None and Path(job.last_checkpoint).is_dir()
    (run,) = (tmp_path / "devices").glob("*/events.jsonl")
    ends = [json.loads(x) for x in run.read_text().splitlines() if '"run_end"' in x]
    assert ends[-1]["status"] == "cancelled"


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


CTRL_C_PROGRAM = """
import asyncio, sys
from tests import devices_parts

async def main():
    job = devices_parts.build(sys.argv[1], max_epochs=5000, progress=True)
    stream = job.events()

    async def first_step():
        async for record in stream:
            if record["event"] == "train_step":
                print("training", flush=True)
                return

    asyncio.ensure_future(first_step())
    await job.train()

asyncio.run(main())
"""


@pytest.mark.distributed
def test_ctrl_c_under_devices_2_ends_as_one_process_does(tmp_path: Path) -> None:
    """A user's ``asyncio.run`` program with ``devices=2``, Ctrl-C (SIGINT to it) after the
    first step: the ranks stop at a checkpoint, the summary says where it is, and the
    program ends by its own KeyboardInterrupt: no rank's traceback, none of core's threads'."""
    program = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_PROGRAM, str(tmp_path)],
        cwd=Path(__file__).parents[1],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert program.stdout is not None
    if program.stdout.readline() != "training\n":  # it ended before training: say why
        pytest.fail(program.communicate(timeout=60)[1][-3000:])
    program.send_signal(signal.SIGINT)
    _, err = program.communicate(timeout=120)
    assert program.returncode == -signal.SIGINT, err  # KeyboardInterrupt, as asyncio.run ends
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    for noise in (
        "rank.py",
        "raised in rank",
        "Exception in thread",
        "forkserver",
        "death signal",
        "closing signal",
        "SignalException",
    ):
        assert noise not in err, err
    assert "status           cancelled" in err, err
    kept = Path(err.split("last checkpoint  ", 1)[1].split()[0])
    assert kept.is_dir() and kept.name.startswith("step-"), err


def test_a_stop_crossing_from_a_rank_carries_no_rank_traceback(tmp_path: Path) -> None:
    stopped = SignalReceived(signal.SIGINT, "ckpt/step-9", rank=0)
    stopped.add_note("(raised in rank 0: Traceback (most recent call last): ...)")
    (tmp_path / "rank0.pickle").write_bytes(pickle.dumps(stopped))
    kept = _kept(tmp_path, [0])
    assert isinstance(kept, SignalReceived) and kept.checkpoint == "ckpt/step-9"
    assert getattr(kept, "__notes__", []) == []
    failure = RuntimeError("a bug")  # a failure keeps its rank's traceback
    failure.add_note("(raised in rank 1: Traceback ...)")
    (tmp_path / "rank1.pickle").write_bytes(pickle.dumps(failure))
    assert _kept(tmp_path, [1]).__notes__ == ["(raised in rank 1: Traceback ...)"]  # type: ignore[union-attr]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_callback_stops_every_rank_of_a_devices_run(tmp_path: Path) -> None:
    from core.callbacks import Callback, Record, RunInfo

    class StopAtStep(Callback):
        def __init__(self) -> None:
            self.answers: list[bool] = []

        async def on_train_step(self, run: RunInfo, record: Record) -> None:
            if record["step"] >= 3 and not self.answers:
                self.answers.append(run.request_stop("enough for this test"))

    stopper = StopAtStep()
    job = devices_parts.build(
        tmp_path,
        max_epochs=50,
        train_loader=isolation_parts.SlowLoader(0.1),
        callbacks=[stopper],
    )
    results = asyncio.run(job.train())
    assert stopper.answers == [True]
    assert results.stop_reason == "requested: enough for this test"
    # A vote (every 16 steps) is counted at the next step: the request, made at step 3, stops
    # every rank at 17 when it reaches rank 0 before the vote at 16 (0.1 s a step), else at
    # 33 on a machine slow to deliver it. Counted at the epoch's end, it stopped at 24.
    assert results.global_step in (17, 33)
    (run,) = (tmp_path / "devices").glob("*/events.jsonl")
    records = [json.loads(x) for x in run.read_text().splitlines()]
    assert records[-1]["status"] == "stopped"
    saved = [r for r in records if r["event"] == "checkpoint" and r["reason"] == "requested"]
    assert [r["step"] for r in saved] == [results.global_step]
