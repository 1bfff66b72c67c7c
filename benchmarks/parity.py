"""Lightning's parity test, for `core`: the same model, data and optimizer trained by a plain
PyTorch loop and by ``await run.train()``, run after run, checked against Lightning's bands.

Lightning's own protocol (its ``parity_pytorch`` tests), kept here:

- each run seeds everything with its index, builds a fresh model and loader, and is timed
  whole (building the trainer included); the first run of each kind is a warm-up, dropped;
  one second of sleep before each run;
- the losses must agree to 5 decimals (the last step's loss of the last epoch);
- **speed band**: the mean of ``(core - mean(plain)) / epochs`` over the runs, in seconds per
  epoch, under 0.05 s;
- **memory band**: the relative excess of the peak memory, under 0.1 %: on CUDA the peak
  allocated memory (as Lightning measures it); on a CPU the peak of the process's resident
  memory during the run, sampled every millisecond (both kinds in one process, the
  libraries imported before either runs, as in Lightning's harness).

`core` runs with its **default settings** (checkpoint at every epoch's end, the run log, the
reports, the progress lines, the device monitor): only the optimizer is given, the same as
the plain loop's, and on CUDA the plain loop's arithmetic (``enable_amp=False, tf32=False``:
core's CUDA defaults are bf16 autocast and TF32 matmuls, which change the losses).
Lightning disables its own checkpoints, logger and progress bar in that test; ``core, lean``
does the same for comparison. Runs of the kinds alternate (Lightning
runs all of one kind, then the other), so a slow spell of the machine hits both.

``--rss`` adds the measure a fault-injection pass used: each kind in a fresh process, its
peak resident memory (``ru_maxrss``), imports included.

    python -m benchmarks.parity                 # both models, 3 runs of 4 epochs (+ warm-up)
    python -m benchmarks.parity --runs 5 --rss --json parity.json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SPEED_BAND_S = 0.05  # seconds per epoch, absolute (Lightning: ParityModuleRNN)
MEMORY_BAND = 0.001  # relative (Lightning: max_diff_memory)
KINDS = ("plain", "core", "core, lean")


class RNN(nn.Module):
    """Lightning's parity RNN: an LSTM over sequences of 10 features, two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(10, 20, batch_first=True)
        self.head = nn.Linear(20, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        logits: torch.Tensor = self.head(out[:, -1])
        return logits


def mnist_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], TensorDataset], int]] = {
    # model, data (built after seeding), batch size
    "rnn": (RNN, lambda: _data((1024, 16, 10), 2), 32),
    "mnist": (mnist_mlp, lambda: _data((3840, 1, 28, 28), 10), 64),
}


def _data(shape: tuple[int, ...], classes: int) -> TensorDataset:
    x = torch.randn(*shape)
    return TensorDataset(x, torch.randint(0, classes, (shape[0],)))


def _seed(seed: int) -> None:
    """Both kinds seed alike (core is not imported by a plain run: ``--rss`` counts it)."""
    random.seed(seed)
    torch.manual_seed(seed)


def _optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.02)


@contextmanager
def peak_memory(device: torch.device) -> Iterator[list[int]]:
    """Yields a one-element list that holds, after the block, the block's peak memory: CUDA
    bytes allocated at the peak, or on a CPU the process's peak resident bytes."""
    box = [0]
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        yield box
        torch.cuda.synchronize()
        box[0] = torch.cuda.max_memory_allocated()
        return
    page = resource.getpagesize()
    statm = Path("/proc/self/statm")
    peak, done = int(statm.read_text().split()[1]) * page, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.001):
            peak = max(peak, int(statm.read_text().split()[1]) * page)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield box
    finally:
        done.set()
        sampler.join()
        peak = max(peak, int(statm.read_text().split()[1]) * page)
        box[0] = peak


def plain_run(model_name: str, seed: int, epochs: int, device: torch.device, _: Path) -> float:
    build, data, batch = MODELS[model_name]
    _seed(seed)
    model = build().to(device)
    loader = DataLoader(data(), batch_size=batch)
    optimizer = _optimizer(model.parameters())
    loss = torch.zeros(())
    for _epoch in range(epochs):
        for inputs, targets in loader:
            loss = F.cross_entropy(model(inputs.to(device)), targets.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return float(loss.item())


def core_run(lean: bool) -> Callable[[str, int, int, torch.device, Path], float]:
    def run(model_name: str, seed: int, epochs: int, device: torch.device, logs: Path) -> float:
        from core import create_optimized_training_optimizer

        build, data, batch = MODELS[model_name]
        _seed(seed)
        model = build()
        loader = DataLoader(data(), batch_size=batch)
        lean_settings: dict[str, Any] = (
            {"checkpoint_every_n_epochs": None, "reports": False, "progress": False} if lean else {}
        )
        optimizer = create_optimized_training_optimizer(
            model=model,
            train_loader=loader,
            optimizer=_optimizer,
            max_epochs=epochs,
            max_grad_norm=None,
            log_dir=logs,
            enable_amp=False,
            tf32=False,
            **lean_settings,
        )
        anyio.run(optimizer.train)
        optimizer.close()
        assert optimizer.run_dir is not None
        steps = [
            json.loads(line)
            for line in (optimizer.run_dir / "events.jsonl").open()
            if '"train_step"' in line
        ]
        return float(steps[-1]["loss"])

    return run


RUNNERS = {"plain": plain_run, "core": core_run(lean=False), "core, lean": core_run(lean=True)}


@dataclass
class Runs:
    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    memory: list[int] = field(default_factory=list)


def measure(model_name: str, runs: int, epochs: int, sleep_s: float) -> dict[str, Runs]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    measured = {kind: Runs() for kind in KINDS}
    with tempfile.TemporaryDirectory() as logs:
        for index in range(runs + 1):  # run 0 is the warm-up of every kind
            order = KINDS if index % 2 else tuple(reversed(KINDS))
            for kind in order:
                gc.collect()
                time.sleep(sleep_s)
                with peak_memory(device) as peak:
                    started = time.perf_counter()
                    loss = RUNNERS[kind](model_name, index, epochs, device, Path(logs))
                    seconds = time.perf_counter() - started
                if index:
                    runs_of = measured[kind]
                    runs_of.losses.append(loss)
                    runs_of.seconds.append(seconds)
                    runs_of.memory.append(peak[0])
    return measured


def bands(measured: dict[str, Runs], epochs: int) -> list[dict[str, Any]]:
    plain = measured["plain"]
    rows = []
    for kind in KINDS[1:]:
        runs = measured[kind]
        pairs = zip(runs.losses, plain.losses, strict=True)
        same = all(round(a, 5) == round(b, 5) for a, b in pairs)
        per_epoch = statistics.mean(
            (s - statistics.mean(plain.seconds)) / epochs for s in runs.seconds
        )
        base = statistics.mean(plain.memory)
        memory = statistics.mean((m - base) / base for m in runs.memory) if base else 0.0
        rows.append(
            {
                "kind": kind,
                "losses_equal": same,
                "seconds_per_epoch_over_plain": per_epoch,
                "speed_pass": per_epoch < SPEED_BAND_S,
                "memory_excess": memory,
                "memory_pass": memory < MEMORY_BAND,
                "seconds": runs.seconds,
                "plain_seconds": plain.seconds,
                "memory": runs.memory,
                "plain_memory": plain.memory,
            }
        )
    return rows


def rss_of(kind: str, model_name: str, epochs: int) -> int:
    """Peak resident memory (KiB) of a fresh process that runs one ``kind`` run."""
    program = (
        "import resource, sys, tempfile, torch\n"
        "from pathlib import Path\n"
        "torch.set_num_threads(1)\n"
        f"kind = {kind!r}\n"
        "if kind != 'plain':\n"
        "    import core  # noqa: F401\n"
        "from benchmarks.parity import RUNNERS\n"
        "with tempfile.TemporaryDirectory() as logs:\n"
        f"    RUNNERS[kind]({model_name!r}, 1, {epochs}, torch.device('cpu'), Path(logs))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    return int(done.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="rnn,mnist")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds before each run")
    parser.add_argument("--rss", action="store_true", help="also each kind in a fresh process")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report: dict[str, Any] = {"device": "cuda" if torch.cuda.is_available() else "cpu"}
    print("| model | kind | losses equal | s/epoch over plain | band | memory excess | band |")
    print("| --- | --- | --- | ---: | --- | ---: | --- |")
    for model_name in args.models.split(","):
        rows = bands(measure(model_name, args.runs, args.epochs, args.sleep), args.epochs)
        report[model_name] = rows
        for row in rows:
            print(
                f"| {model_name} | {row['kind']} | {row['losses_equal']} | "
                f"{row['seconds_per_epoch_over_plain']:+.4f} | "
                f"{'pass' if row['speed_pass'] else 'FAIL'} (< {SPEED_BAND_S}) | "
                f"{row['memory_excess']:+.3%} | "
                f"{'pass' if row['memory_pass'] else 'FAIL'} (< {MEMORY_BAND:.1%}) |"
            )
        if args.rss:
            rss = {kind: rss_of(kind, model_name, args.epochs) for kind in KINDS}
            report[f"{model_name}_rss_kib"] = rss
            print(f"| {model_name} | peak RSS, fresh processes (KiB) | {rss} | | | | |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
