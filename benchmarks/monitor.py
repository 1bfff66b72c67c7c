"""Throughput with the GPU monitor sampling at 10 Hz against no monitor, in one process.

    python -m benchmarks.monitor            # the MLP of benchmarks/overhead.py, 7 rounds

Each round trains the same job twice with ``await optimizer.train()`` (order alternating):
once with ``monitor_interval_s=0.1`` and once with ``enable_gpu_monitoring=False``. The
monitor samples NVML on a GPU machine and the host through psutil elsewhere. Goal:
>= 0.998 on GPU, >= 0.99 on a CPU. The cost of one sample alone is
``python -m benchmarks.monitor_sample_cost``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import torch

from benchmarks.overhead import DTYPES, make_job
from core import GradientAccumulationConfig, MultiGPUConfig, create_optimized_training_optimizer


def job(
    model: torch.nn.Module,
    batches: list,  # type: ignore[type-arg]
    args: argparse.Namespace,
    monitored: bool,
    tmp: Path,
    **settings: Any,
) -> float:
    """Seconds of one ``train()`` call; ``settings`` go to the factory (the GPU suite
    switches progress, reports and checkpoints off)."""
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=batches,
        max_epochs=args.epochs,
        learning_rate=1e-4,
        amp_dtype=DTYPES[args.precision],
        gradient_accumulation_config=GradientAccumulationConfig(args.accum),
        max_grad_norm=1.0,
        log_dir=tmp,
        experiment_name="monitor",
        monitor_interval_s=0.1,
        multi_gpu_config=MultiGPUConfig(enable_gpu_monitoring=monitored),
        **settings,
    )
    started = time.perf_counter()
    anyio.run(optimizer.train)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "gpt2"], default="mlp")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=list(DTYPES), default="fp32")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    device = torch.device(args.device)
    model, batches = make_job(args, device)
    samples = args.epochs * sum(len(y) for _, y in batches)
    rates: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        job(copy.deepcopy(model), batches[: 4 * args.accum], args, True, Path(tmp))  # warm-up
        for round_ in range(args.rounds):
            for monitored in (True, False) if round_ % 2 == 0 else (False, True):
                seconds = job(copy.deepcopy(model), batches, args, monitored, Path(tmp))
                rates[monitored].append(samples / seconds)
    with_monitor, without = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"{'device':>26}: {device}")
    print(f"{'monitored samples/s':>26}: {with_monitor:.1f}")
    print(f"{'unmonitored samples/s':>26}: {without:.1f}")
    print(f"{'ratio (10 Hz / none)':>26}: {with_monitor / without:.4f}")


if __name__ == "__main__":
    main()
