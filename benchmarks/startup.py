"""Start-up latency: seconds until a run's first ``train_step`` record, against bare torchrun.

    python -m benchmarks.startup                 # 3 alternated repeats of every scenario
    python -m benchmarks.startup --repeats 5 --json startup.json

Scenarios, each in a fresh interpreter (``python -m benchmarks.startup --child NAME``), so
that every one pays what a new program pays:

- ``process``: ``isolation="process"`` with a warm service. ``async with run:`` starts the
  fork server; the scenario waits until it has imported torch and ``core`` (a no-op process
  started from it), then times ``await run.train()`` to the first ``train_step`` record in
  ``run.events()`` (the MLP of ``benchmarks.models``, CPU). Then the same for a second job
  in the same process (``second``): nothing of the first child is reused.
- ``devices``: ``create_optimized_training_optimizer(..., devices=2)``, a tiny MLP on CPU
  (gloo), ``train()`` called at once (no ``async with``: it starts the fork server, whose
  child is torch's elastic launcher, which forks the 2 ranks that rebuild the job). Timed
  from the run's creation and from the ``train()`` call to the first ``train_step`` record
  (rank 0's, relayed).
- ``torchrun``: the floor, ``torchrun --standalone --nproc-per-node 2 script.py`` where the
  script imports torch, joins a gloo group and runs one ``all_reduce``; timed by this process
  from the launch to rank 0's line after the ``all_reduce``.

The scenarios alternate (their order rotates every repeat); each row gives the median, min
and max over ``--repeats``. The last row is ``devices`` from ``train()`` minus ``torchrun``,
per repeat, against the goal: at most bare torchrun + 1 s. "other" is how many cores other
processes kept busy while a scenario ran (``/proc/stat`` minus this benchmark's processes);
``*`` marks a row with a sample taken beside more than 0.1 of a core, and ``--quiet-wait``
waits (up to that many seconds) for an idle machine before each sample.

This module imports only the standard library and psutil at its top: the training
processes and ranks that re-import a program's main module pay nothing for it. Where a
checkout has no ``__pycache__`` and ``PYTHONDONTWRITEBYTECODE`` is set, every new
interpreter compiles ``core`` from source (about 0.2 s each on a 2-core CPU): a note says so.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.machine_load import DISTURBED_CORES, OtherLoad

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 1.0
"""``devices=2`` from ``train()`` may take at most this much longer than bare torchrun."""
BARE_SCRIPT = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
if dist.get_rank() == 0:
    print("all_reduce done", flush=True)
dist.destroy_process_group()
"""
SCENARIOS = ("process", "devices", "torchrun")
ROWS = (
    ("process:first", "process, warm service: train() -> first step"),
    ("process:second", "process, warm service: 2nd job's train()"),
    ("devices:creation", "devices=2: creation -> first step"),
    ("devices:train", "devices=2: train() -> first step"),
    ("torchrun:collective", "bare torchrun: launch -> first all_reduce"),
)


def wait_for_quiet(limit_s: float) -> None:
    """Wait until other processes keep less than DISTURBED_CORES busy for 2 s (at most
    ``limit_s``)."""
    deadline, quiet = time.monotonic() + limit_s, 0
    while quiet < 2 and time.monotonic() < deadline:
        with OtherLoad() as load:
            time.sleep(1.0)
        quiet = quiet + 1 if (load.cores or 0.0) < DISTURBED_CORES else 0


# -- the scenarios, each in a child interpreter -----------------------------------------------
async def first_step_at(run: Any) -> float:
    """Run ``train()``; return when (``perf_counter``) its first ``train_step`` record came."""
    stream = run.events()
    first: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def watch() -> None:
        async for record in stream:
            if record["event"] == "train_step" and not first.done():
                first.set_result(time.perf_counter())

    watcher = asyncio.create_task(watch())
    await run.train()
    await watcher
    if not first.done():
        raise RuntimeError("train() ended without a train_step record")
    return first.result()


def wait_for_fork_server() -> None:
    """Return once the fork server ``async with run:`` started has imported torch and core
    (it forks a process only after its imports)."""
    import multiprocessing

    process = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(0,))
    process.start()
    process.join()


async def process_scenario(log_dir: Path) -> dict[str, float]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from benchmarks.models import mlp
    from core import create_optimized_training_optimizer

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4096, 256, generator=g), torch.randint(10, (4096,)))
    seconds = {}
    for name in ("first", "second"):
        run = create_optimized_training_optimizer(
            model=mlp(),
            train_loader=DataLoader(data, batch_size=64, shuffle=True),
            max_epochs=1,
            seed=0,
            isolation="process",
            log_dir=log_dir,
            experiment_name=f"startup_{name}",
            progress=False,
            reports=False,
        )
        async with run:
            await asyncio.to_thread(wait_for_fork_server)
            started = time.perf_counter()
            seconds[name] = await first_step_at(run) - started
    return seconds


async def devices_scenario(log_dir: Path) -> dict[str, float]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from core import create_optimized_training_optimizer

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 16, generator=g)
    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=32, shuffle=True)
    created = time.perf_counter()
    run = create_optimized_training_optimizer(
        model=nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)),
        train_loader=loader,
        max_epochs=1,
        seed=0,
        devices=2,
        log_dir=log_dir,
        experiment_name="startup_devices",
        progress=False,
        reports=False,
    )
    called = time.perf_counter()
    first = await first_step_at(run)
    return {"creation": first - created, "train": first - called}


def child(scenario: str) -> None:
    """Run one scenario here; print its seconds and the other load as one JSON line."""
    with OtherLoad() as load, tempfile.TemporaryDirectory() as tmp:
        main = process_scenario if scenario == "process" else devices_scenario
        seconds = asyncio.run(main(Path(tmp)))
    print(json.dumps({"seconds": seconds, "other": load.cores or 0.0}))


# -- the parent: alternated runs --------------------------------------------------------------
@dataclass
class Sample:
    seconds: dict[str, float]
    other: float


def run_child(scenario: str, timeout_s: float) -> Sample:
    command = [sys.executable, "-m", "benchmarks.startup", "--child", scenario]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{scenario} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return Sample(result["seconds"], result["other"])


def torchrun_command(script: Path) -> list[str]:
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = (
        [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    )
    return [*launcher, "--standalone", "--nproc-per-node", "2", str(script)]


def run_torchrun(timeout_s: float) -> Sample:
    """Launch -> rank 0's line after its all_reduce, read here; then wait for torchrun's exit."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "bare_all_reduce.py"
        script.write_text(BARE_SCRIPT)
        load = OtherLoad()
        load.start()
        started = time.perf_counter()
        process = subprocess.Popen(
            torchrun_command(script), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert process.stdout is not None
        seconds = None
        for line in process.stdout:
            if line.startswith("all_reduce done") and seconds is None:
                seconds = time.perf_counter() - started
        code = process.wait(timeout=timeout_s)
        if seconds is None or code != 0:
            raise RuntimeError(f"torchrun exited with {code} before the all_reduce")
        return Sample({"collective": seconds}, load.stop() or 0.0)


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):8.2f} {min(values):7.2f} {max(values):7.2f}"


def machine() -> str:
    import torch

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = platform.processor() or platform.machine()
    return (
        f"{now}; {os.cpu_count()} CPUs ({cpu}), torch {torch.__version__}, "
        f"Python {platform.python_version()}"
    )


def bytecode_note() -> str | None:
    if sys.dont_write_bytecode and not (ROOT / "core" / "__pycache__").is_dir():
        return (
            "note: PYTHONDONTWRITEBYTECODE is set and core has no __pycache__: every "
            "interpreter here compiles core from source"
        )
    return None


def report(samples: dict[str, list[Sample]], repeats: int, where: str) -> dict[str, Any]:
    values: dict[str, list[float]] = {}
    others: dict[str, float] = {}
    for scenario, runs in samples.items():
        for sample in runs:
            for part, seconds in sample.seconds.items():
                key = f"{scenario}:{part}"
                values.setdefault(key, []).append(seconds)
                others[key] = max(others.get(key, 0.0), sample.other)
    ours, floor = values["devices:train"], values["torchrun:collective"]
    gaps = [a - b for a, b in zip(ours, floor, strict=True)]  # the same repeat's pair
    print(f"\nStart-up to the first train_step record ({where})")
    print(f"{repeats} alternated repeats, seconds\n")
    print(f"{'scenario':46} {'median':>8} {'min':>7} {'max':>7}  other")
    for key, label in ROWS:
        flag = "*" if others[key] > DISTURBED_CORES else " "
        print(f"{label:46} {summary(values[key])}  {others[key]:.2f}{flag}")
    verdict = "met" if statistics.median(gaps) <= GOAL_S else "missed"
    print(
        f"{'devices=2 train() - bare torchrun':46} {summary(gaps)}  goal <= {GOAL_S:g} s: {verdict}"
    )
    note = bytecode_note()
    if note:
        print(note)
    return {"machine": where, "seconds": values, "gap_s": gaps, "other_cores": others}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="seconds to wait at most for an idle machine before each sample",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per sample")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--child", choices=SCENARIOS[:2], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    where = machine()
    samples: dict[str, list[Sample]] = {scenario: [] for scenario in SCENARIOS}
    for repeat in range(args.repeats):
        shift = repeat % len(SCENARIOS)
        for scenario in SCENARIOS[shift:] + SCENARIOS[:shift]:
            wait_for_quiet(args.quiet_wait)
            if scenario == "torchrun":
                sample = run_torchrun(args.timeout)
            else:
                sample = run_child(scenario, args.timeout)
            samples[scenario].append(sample)
            shown = ", ".join(f"{k} {v:.2f} s" for k, v in sample.seconds.items())
            print(f"  [{repeat + 1}/{args.repeats}] {scenario}: {shown} (other {sample.other:.2f})")
    figures = report(samples, args.repeats, where)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
