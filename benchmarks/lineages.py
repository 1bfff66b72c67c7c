"""What checkpoint lineages cost at the size users train: resume="auto" past other lineages,
and the commits (a new checkpoint, an in-place replace, pruning) of a 58M-parameter model.

One experiment directory holds the lineage a run continues (``A``, unfinished) and
``--others`` newer lineages it cannot continue (other batch sizes). Then a run with
``resume="auto"`` starts, and the time from its ``run_start`` record to its ``resumed``
record is what choosing and loading cost. Measured three ways, alternated ``--repeats`` times:

- ``alone``: only ``A`` is there (verify its newest checkpoint, load it);
- ``past N``: ``A`` and N newer incompatible lineages, each passed over on the settings its
  manifest records (a manifest read each);
- ``past N, no record``: the same with that record ignored, so each newer lineage is
  verified (every byte hashed) and loaded before it is passed over: what the record saves.

The commits are read from ``A``'s own ``checkpoint`` records (``save_time_s``): a step
checkpoint (a rename, the last link, pruning the previous one: a rename and a removal), and
the epoch's end rewriting the same step in place (an atomic swap and a removal).

    python -m benchmarks.lineages                   # the 60m model, 3 other lineages
    python -m benchmarks.lineages --size small --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import torch

from benchmarks.isolation import SIZES, Wide, loader
from core import (
    CheckpointConfig,
    LoggingConfig,
    OptimConfig,
    OptimizedTrainingOptimizer,
    RunConfig,
    TrainingConfig,
)
from core.checkpointing.store import CheckpointStore


def train(log_dir: Path, size: str, batch: int, epochs: int, steps: int) -> Path:
    """One run of the experiment: ``epochs`` epochs of ``steps`` steps of ``batch`` samples,
    a checkpoint every step (one kept); returns its run directory."""
    vocab, width, depth = SIZES[size]
    torch.manual_seed(0)
    config = TrainingConfig(
        run=RunConfig(experiment_name="lineages", max_epochs=epochs, log_dir=log_dir, seed=0),
        optim=OptimConfig(learning_rate=1e-4),
        checkpoint=CheckpointConfig(checkpoint_every_n_steps=1, keep_last_n=1, resume="auto"),
        logging=LoggingConfig(progress=False, reports=False),
    )
    job = OptimizedTrainingOptimizer(
        config, model=Wide(vocab, width, depth), train_loader=loader(vocab, steps, batch)
    )
    results = anyio.run(job.train)
    return Path(results.run_dir)


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def seconds_between(run: list[dict[str, Any]], first: str, second: str) -> float:
    stamp = {r["event"]: datetime.datetime.fromisoformat(r["ts"]) for r in reversed(run)}
    return (stamp[second] - stamp[first]).total_seconds()


def resume_time(root: Path, size: str, others: int, record: bool) -> float:
    """Seconds from run_start to resumed for a resume of A past ``others`` lineages."""
    base = root / f"base-{others}"
    log_dir = root / "trial"
    shutil.rmtree(log_dir, ignore_errors=True)
    shutil.copytree(base, log_dir, symlinks=True)
    ignored = mock.patch.object(CheckpointStore, "recorded_fingerprint", return_value=None)
    with contextlib.nullcontext() if record else ignored:
        run = records(train(log_dir, size, batch=8, epochs=2, steps=2))
    (resumed,) = (r for r in run if r["event"] == "resumed")
    assert len(resumed["passed_over"]) == others, resumed
    return seconds_between(run, "run_start", "resumed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="60m")
    parser.add_argument("--others", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    vocab, width, depth = SIZES[args.size]
    parameters = sum(p.numel() for p in Wide(vocab, width, depth).parameters())
    with tempfile.TemporaryDirectory(prefix="lineages-", dir=Path.home()) as tmp:
        root = Path(tmp)
        for others in (0, args.others):
            base = root / f"base-{others}"
            first = records(train(base, args.size, batch=8, epochs=1, steps=2))  # A
            for index in range(others):  # newer lineages A cannot continue
                train(base, args.size, batch=16 + index, epochs=1, steps=1)
        saves = [r for r in first if r["event"] == "checkpoint"]
        rows: dict[str, list[float]] = {"alone": [], "past": [], "past, no record": []}
        for _ in range(args.repeats):
            rows["alone"].append(resume_time(root, args.size, 0, record=True))
            rows["past"].append(resume_time(root, args.size, args.others, record=True))
            rows["past, no record"].append(resume_time(root, args.size, args.others, False))
    size_mb = sum(p.numel() * 4 for p in Wide(vocab, width, depth).parameters()) * 3 / 2**20
    print(
        f"# {args.size}: {parameters / 1e6:.1f}M parameters, a checkpoint of ~{size_mb:.0f} MB "
        f"(AdamW), torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{datetime.date.today()}"
    )
    for save in saves:
        print(f"commit step {save['step']} ({save['reason']}): {save['save_time_s']:.2f} s")
    print(f"resume='auto', run_start -> resumed, median of {args.repeats}:")
    for name, values in rows.items():
        label = name.replace("past", f"past {args.others} lineages")
        print(f"  {label:<28} {statistics.median(values):6.2f} s  {sorted(values)}")


if __name__ == "__main__":
    main()
