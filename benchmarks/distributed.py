"""Throughput of the distributed strategies (torchrun, gloo on CPU / NCCL on GPU).

    python -m benchmarks.distributed            # launches the torchrun jobs, prints ratios

1. DDP with world size 1 against the plain single-device path, alternated in one process
   (goal >= 0.97): the cost of the DDP wrapper, the stop votes and the samplers alone.
2. Per-rank throughput of 2 DDP ranks against one process alone (goal >= 0.8 on a 2-core
   CPU): what gradient all-reduce and sharing the machine cost each rank.

The same ratios for a hand-written loop (plain, and wrapped in DDP) separate what DDP itself
costs from what core adds.

Throughput is ``TrainingResults.samples_per_s`` (training time only; start-up, validation
and process launch excluded). CPU runs use one torch thread per process, so 2 ranks use the
2 cores the single process could not.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.models import mlp  # noqa: E402
from core import MultiGPUConfig, create_optimized_training_optimizer  # noqa: E402
from core.multi_gpu_training import setup_distributed_environment  # noqa: E402


def dataset(args: argparse.Namespace) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    n = args.batch_size * args.steps * int(os.environ.get("WORLD_SIZE", "1"))
    return TensorDataset(torch.randn(n, 256, generator=g), torch.randint(10, (n,), generator=g))


def hand(mode: str, model: torch.nn.Module, args: argparse.Namespace, log_dir: Path) -> float:
    """A hand-written loop (wrapped in DDP for "hand_ddp"), timed over the same epochs."""
    device = next(model.parameters()).device
    data = dataset(args)
    if mode == "hand_ddp":
        sampler: Any = DistributedSampler(data, shuffle=True)
        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.index is not None else None
        )
    else:
        sampler = RandomSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    samples, start = 0, time.perf_counter()
    for epoch in range(args.epochs):
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        for inputs, targets in loader:
            x, y = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            samples += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return samples / (time.perf_counter() - start)


def job(mode: str, model: torch.nn.Module, args: argparse.Namespace, log_dir: Path) -> float:
    if mode.startswith("hand"):
        return hand(mode, model, args, log_dir)
    quiet: dict[str, Any] = {}
    if getattr(args, "quiet", False):  # the GPU suite: no progress, reports or checkpoints
        quiet = {"progress": False, "reports": False, "checkpoint_every_n_epochs": None}
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(dataset(args), batch_size=args.batch_size, shuffle=True),
        max_epochs=args.epochs,
        learning_rate=1e-4,
        max_grad_norm=1.0,
        amp_dtype=args.precision,
        log_dir=log_dir,
        experiment_name=f"bench_{mode}",
        multi_gpu_config=MultiGPUConfig(training_mode=mode),  # type: ignore[arg-type]
        compile=False,  # the hand-written loops run eagerly: like for like
        **quiet,
    )
    results = anyio.run(optimizer.train)
    optimizer.close()
    return results.samples_per_s


def worker(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    info = setup_distributed_environment()
    torch.manual_seed(0)
    model = mlp().cuda() if torch.cuda.is_available() else mlp()
    single = "single_gpu" if torch.cuda.is_available() else "cpu"
    modes = ["distributed", "hand_ddp", single, "hand"]
    if info["world_size"] > 1:
        modes = ["distributed", "hand_ddp"]
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        job("distributed", copy.deepcopy(model), args, Path(tmp))  # warm-up
        for round_ in range(args.rounds):
            for mode in modes if round_ % 2 == 0 else modes[::-1]:
                rates[mode].append(job(mode, copy.deepcopy(model), args, Path(tmp)))
    if info["rank"] == 0:
        medians = {mode: statistics.median(r) for mode, r in rates.items() if r}
        args.out.write_text(json.dumps({"world_size": info["world_size"], **medians}))
    torch.distributed.destroy_process_group()


def child_env(threads: int) -> dict[str, str]:
    """The environment of the torchrun job: this one, with the repository root put in front
    of ``PYTHONPATH``. Prepended, not replaced: a machine may name its installed packages
    there (wheels unpacked into a directory), and the workers must still import them."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": str(threads or 1), "PYTHONPATH": path}


def launch(
    nproc: int, args: argparse.Namespace, out: Path, timeout: float | None = None
) -> dict[str, Any]:
    """Run the worker under torchrun; its rank 0 writes ``out``. On a timeout (or the GPU
    suite's budget alarm) torchrun is stopped with SIGTERM, which it forwards to its workers,
    so none of them keeps the GPU busy while the next measurement runs."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(Path(__file__)),
        "--worker",
        "--out",
        str(out),
        "--rounds",
        str(args.rounds),
        "--steps",
        str(args.steps),
        "--epochs",
        str(args.epochs),
        "--threads",
        str(args.threads),
        "--batch-size",
        str(args.batch_size),
        "--precision",
        args.precision,
    ] + (["--quiet"] if getattr(args, "quiet", False) else [])
    with subprocess.Popen(
        command,
        env=child_env(args.threads),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:  # a timeout, or the suite's budget alarm
            _stop_torchrun(process)
            raise
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command, stdout, stderr)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _stop_torchrun(process: subprocess.Popen[str]) -> None:
    """SIGTERM to torchrun's process group (torchrun forwards it to its workers, which run
    in sessions of their own), SIGKILL after 10 s."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0 if torch.cuda.is_available() else 1)
    parser.add_argument("--precision", default="auto")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress lines, reports or checkpoints"
    )
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        one = launch(1, args, Path(tmp) / "one.json")
        two_ranks = not torch.cuda.is_available() or torch.cuda.device_count() >= 2
        two = launch(2, args, Path(tmp) / "two.json") if two_ranks else None
    single = "single_gpu" if "single_gpu" in one else "cpu"
    summary = {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "threads_per_process": args.threads,
        "batch_size": args.batch_size,
        "core_single_samples_per_s": round(one[single], 1),
        "core_ddp_ws1_samples_per_s": round(one["distributed"], 1),
        "core: ddp_ws1 / single": round(one["distributed"] / one[single], 4),
        "hand: ddp_ws1 / plain": round(one["hand_ddp"] / one["hand"], 4),
        "ddp_ws1: core / hand": round(one["distributed"] / one["hand_ddp"], 4),
    }
    if two is not None:
        summary["core_ddp_ws2_per_rank_samples_per_s"] = round(two["distributed"], 1)
        summary["core: ddp_ws2 per rank / single"] = round(two["distributed"] / one[single], 4)
        summary["hand: ddp_ws2 per rank / plain"] = round(two["hand_ddp"] / one["hand"], 4)
    for key, value in summary.items():
        print(f"{key:>32}: {value}")


if __name__ == "__main__":
    main()
