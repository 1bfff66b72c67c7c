"""Many runs on one checkpoint directory, killed and restarted at random: two services and a
torchrun job (``devices=2``, gloo), all ``resume="auto"``.

Service ``A`` trains in a thread, service ``B`` in a training process (``isolation=
"process"``); each trains again and again in one process, every run continuing what it can.
The torchrun job ``T`` is two gloo ranks (its world size makes its lineages its own). Every
1-4 s one of them, at random, is stopped in a way chosen at random: SIGKILL or SIGTERM of a
service, SIGKILL of B's training process (B lives on and starts its next run), SIGKILL of the
torchrun job's process group or SIGTERM to its launcher; then it is started again, until
``--events`` such kills. At the end each is stopped with SIGTERM.

What is checked, and printed:

- every checkpoint a run names as it ends (``results.best_checkpoint`` and
  ``last_checkpoint``, the checkpoint of a ``SignalReceived`` or ``TrainingProcessDied``)
  exists when it names it: each run checks, as it reports;
- after every kill, each lineage's checkpoints (``keep_last_n`` + ``save_top_k``, one more
  while a commit is between its rename and its pruning) and the ``last`` link;
- at the end: every checkpoint verifies, each lineage within its retention, no lock left;
  and how the runs resumed (continued, branched, started fresh, lineages passed over as
  held by a live run).

    python -m benchmarks.lineage_storm                  # 30 kills and restarts
    python -m benchmarks.lineage_storm --events 10 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from core import (
    Callback,
    CoreError,
    SignalReceived,
    TrainingProcessDied,
    create_optimized_training_optimizer,
)
from core.callbacks import Record, RunInfo
from core.checkpointing.lineage_lock import holder_of
from core.checkpointing.store import CheckpointStore

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "storm"
KEEP_LAST_N, TOP_K = 2, 1
STEP_S = 0.03  # each training forward: runs last a few seconds, kills land mid-run


class Slow(nn.Module):
    """A small MLP whose training forward takes ``STEP_S``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            time.sleep(STEP_S)
        out: torch.Tensor = self.net(x)
        return out


def data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] * x[:, 1] > 0).long())


def sgd(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)


class Training(Callback):
    """Creates ``<root>/training/<actor>`` at the run's first step: the storm stops only
    processes that train (one stopped while it starts tells nothing)."""

    def __init__(self, root: Path, actor: str) -> None:
        self.marker = root / "training" / actor

    async def on_record(self, run: RunInfo, record: Record) -> None:
        if record["event"] == "train_step" and not self.marker.exists():
            self.marker.touch()


def build(root: Path, actor: str, isolation: str, max_epochs: int) -> Any:
    """One run of the experiment: every 2 steps a checkpoint, the 2 newest and the best."""
    return create_optimized_training_optimizer(
        callbacks=[Training(root, actor)],
        model=Slow(),
        train_loader=DataLoader(data(64, 0), batch_size=8, shuffle=True),
        val_loader=DataLoader(data(16, 1), batch_size=8),
        optimizer=sgd,
        max_epochs=max_epochs,
        seed=0,
        log_dir=root / "logs",
        experiment_name=EXPERIMENT,
        checkpoint_every_n_steps=2,
        keep_last_n=KEEP_LAST_N,
        save_top_k=TOP_K,
        save_last=True,
        resume="auto",
        handle_signals=True,
        isolation=isolation,
        progress=False,
        reports=False,
    )


# -- the runs: each reports what it names, and whether it exists then ----------------------
def report(
    root: Path, actor: str, status: str, named: dict[str, str | None], error: str = ""
) -> None:
    exists = {key: Path(path).is_dir() for key, path in named.items() if path is not None}
    line = {"actor": actor, "pid": os.getpid(), "status": status, "named": named}
    line |= {"exists": exists, "error": error}
    with (root / "reports" / f"{actor}.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")


async def serve(root: Path, actor: str, isolation: str) -> int:
    """A service: trains again and again, each run ``resume="auto"``, until a signal."""
    while True:
        job = build(root, actor, isolation, max_epochs=20)
        try:
            results = await job.train()
        except SignalReceived as exc:
            report(root, actor, "signal", {"checkpoint": exc.checkpoint})
            return exc.exit_code
        except TrainingProcessDied as exc:  # its training process was killed: the next run
            report(root, actor, "died", {"checkpoint": exc.checkpoint}, str(exc))
            continue
        except CoreError as exc:
            report(root, actor, "failed", {}, f"{type(exc).__name__}: {exc}")
            continue
        named = {"best": results.best_checkpoint, "last": results.last_checkpoint}
        report(root, actor, "completed", named)


def rank(root: Path) -> int:
    """One rank of the torchrun job; rank 0 reports."""
    torch.set_num_threads(1)
    first = os.environ.get("RANK", "0") == "0"
    job = build(root, "T", "thread", max_epochs=12)
    try:
        results = asyncio.run(job.train())
    except SignalReceived as exc:
        if first:
            report(root, "T", "signal", {"checkpoint": exc.checkpoint})
        return exc.exit_code
    if first:
        named = {"best": results.best_checkpoint, "last": results.last_checkpoint}
        report(root, "T", "completed", named)
    return 0


def role_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=("A", "B", "rank"), required=True)
    parser.add_argument("--root", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.role == "rank":
        return rank(args.root)
    torch.set_num_threads(1)
    isolation = "thread" if args.role == "A" else "process"
    return asyncio.run(serve(args.root, args.role, isolation))


# -- the storm --------------------------------------------------------------------------------
WAYS = {
    "A": ("sigkill", "sigterm"),
    "B": ("sigkill", "sigterm", "child"),
    "T": ("sigkill", "sigterm"),
}
"""How each is stopped: its process (SIGKILL: the torchrun job's whole group), or B's
training process alone."""
SETTLE_S = 60.0
"""How long one that has not trained yet may start up before it is stopped anyway."""
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
_ROLE = (
    "import sys; from benchmarks.lineage_storm import role_main; sys.exit(role_main(sys.argv[1:]))"
)


def start(actor: str, root: Path) -> subprocess.Popen[bytes]:
    (root / "training" / actor).unlink(missing_ok=True)
    if actor == "T":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc_per_node=2", "-m", "benchmarks.lineage_storm", "--role", "rank"]
    else:
        command = [sys.executable, "-c", _ROLE, "--role", actor]
    log = (root / "output" / f"{actor}.log").open("ab")
    return subprocess.Popen(
        [*command, "--root", str(root)],
        cwd=ROOT,
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def training_process_of(service: subprocess.Popen[bytes]) -> psutil.Process | None:
    """B's training process (a child of its fork server), if it has one now."""
    try:
        children = psutil.Process(service.pid).children()
        servers = [c for c in children if "forkserver" in " ".join(c.cmdline())]
        trainers = [t for server in servers for t in server.children()]
    except psutil.Error:
        return None
    return trainers[0] if trainers else None


def stop(actor: str, process: subprocess.Popen[bytes], how: str) -> None:
    if how == "sigkill":
        os.killpg(process.pid, signal.SIGKILL) if actor == "T" else process.kill()
    elif how == "sigterm":
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:  # a stop that never came: say so, and go on
        print(f"  {actor} did not stop within 120 s after {how}; killed")
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def lineages(directory: Path) -> dict[str | None, list[Path]]:
    grouped: dict[str | None, list[Path]] = collections.defaultdict(list)
    store = CheckpointStore(directory, keep_last_n=1)
    for path in store.committed():
        grouped[store.lineage_of(path)].append(path)
    return grouped


def inspect(directory: Path, worst: dict[str, int]) -> None:
    """Each lineage's size now (one over while a commit is pruning), and the last link."""
    for members in lineages(directory).values():
        worst["lineage_max_during"] = max(worst["lineage_max_during"], len(members))
        if len(members) > KEEP_LAST_N + TOP_K + 1:
            worst["over_retention_during"] += 1
    link = directory / "last"
    if link.is_symlink() and not (directory / os.readlink(link)).is_dir():
        worst["last_dangling"] += 1


def reports(root: Path) -> list[dict[str, Any]]:
    found = []
    for file in sorted((root / "reports").glob("*.jsonl")):
        found += [json.loads(line) for line in file.read_text().splitlines()]
    return found


def records(root: Path, event: str) -> list[dict[str, Any]]:
    found = []
    for log in (root / "logs" / EXPERIMENT).glob("*/events.jsonl"):
        for line in log.read_text().splitlines():
            with_event = json.loads(line)
            if with_event.get("event") == event:
                found.append(with_event)
    return found


def storm(root: Path, events: int, chooser: random.Random) -> dict[str, Any]:
    for folder in ("reports", "output", "training"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    directory = root / "logs" / EXPERIMENT / "checkpoints"
    running = {actor: start(actor, root) for actor in ("A", "B", "T")}
    born = dict.fromkeys(running, time.monotonic())
    kinds: collections.Counter[str] = collections.Counter()
    worst = {"lineage_max_during": 0, "over_retention_during": 0, "last_dangling": 0}
    started, event = time.monotonic(), 0
    while event < events:
        time.sleep(chooser.uniform(1.0, 4.0))
        now = time.monotonic()
        ready = sorted(
            actor
            for actor in running
            if (root / "training" / actor).exists() or now - born[actor] >= SETTLE_S
        )
        if not ready:
            continue
        actor = chooser.choice(ready)
        how = chooser.choice(WAYS[actor])
        process = running[actor]
        if process.poll() is not None:  # it ended on its own: start it again
            how = "ended"
        elif how == "child":
            trainer = training_process_of(process)
            if trainer is None:
                how = "sigkill"
            else:
                (root / "training" / actor).unlink(missing_ok=True)
                trainer.kill()
        if how not in ("child", "ended"):
            stop(actor, process, how)
        if how != "child":
            running[actor] = start(actor, root)
        born[actor] = time.monotonic()
        kinds[f"{actor} {how}"] += 1
        event += 1
        inspect(directory, worst)
        print(f"  event {event:2d}: {actor} {how}")
    for actor, process in running.items():  # the end: every one stopped gracefully
        stop(actor, process, "sigterm")
    time.sleep(2)  # B's training processes of killed services finish their stop
    elapsed = time.monotonic() - started
    return {"kinds": kinds, "worst": worst, "elapsed_s": elapsed}


def summary(root: Path, outcome: dict[str, Any]) -> dict[str, Any]:
    directory = root / "logs" / EXPERIMENT / "checkpoints"
    ended = reports(root)
    named = [(line, key) for line in ended for key in line["exists"]]
    missing = [
        f"{line['actor']} {key}: {line['named'][key]}"
        for line, key in named
        if not line["exists"][key]
    ]
    store = CheckpointStore(directory, keep_last_n=1)
    invalid = [path.name for path in store.committed() if not store.verifies(path)]
    sizes = {str(lineage): len(members) for lineage, members in lineages(directory).items()}
    resumed = records(root, "resumed")
    passed = [
        entry["reason"]
        for r in [*resumed, *records(root, "fresh_start")]
        for entry in r["passed_over"]
    ]
    return {
        "elapsed_s": round(outcome["elapsed_s"], 1),
        "kills": dict(sorted(outcome["kinds"].items())),
        "runs_ended": dict(collections.Counter(f"{r['actor']} {r['status']}" for r in ended)),
        "checkpoints_named": len(named),
        "named_but_missing": missing,
        "runs_started": len(records(root, "run_start")),
        "resumed_continued": sum(not r["branched"] for r in resumed),
        "resumed_branched": sum(bool(r["branched"]) for r in resumed),
        "fresh_starts": len(records(root, "run_start")) - len(resumed),
        "passed_over": dict(collections.Counter(passed)),
        "lineages": len(sizes),
        "checkpoints_per_lineage_at_end": sorted(sizes.values(), reverse=True),
        "over_retention_at_end": sum(size > KEEP_LAST_N + TOP_K for size in sizes.values()),
        **outcome["worst"],
        "invalid_at_end": invalid,
        "locks_held_at_end": sum(holder_of(directory, name) is not None for name in sizes),
        "stale_lock_files_at_end": len(list(directory.glob(".lineage-*.lock"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="run here and keep the files")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="core-storm-"))
    print(f"lineage storm: {args.events} kills, seed {args.seed}, {root}")
    machine = platform.processor() or platform.machine()
    print(f"  {machine}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    outcome = storm(root, args.events, random.Random(args.seed))
    figures = summary(root, outcome)
    for key, value in figures.items():
        print(f"{key:32s} {value}")
    holds = not figures["named_but_missing"] and not figures["invalid_at_end"]
    holds = holds and not figures["over_retention_during"] and not figures["last_dangling"]
    print("holds" if holds else "DOES NOT HOLD")


if __name__ == "__main__":
    if "--role" in sys.argv:
        sys.exit(role_main(sys.argv[1:]))
    main()
