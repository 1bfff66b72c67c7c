"""Where the host time of core's optimizer steps goes, on this machine's device: the step
thread's own calls under ``cProfile`` (a profiler sees only the thread that enables it, so
it is enabled inside core's step thread), for the MLP of ``benchmarks.overhead`` (fp32,
batch 64, accumulation 2), beside the same steps of a hand-written loop, timed.

    python -m benchmarks.step_profile                # 300 steps, top 30 by own time
    python -m benchmarks.step_profile --steps 600 --top 40
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import sys
import tempfile
import time
from typing import Any

import anyio
import torch
from torch import nn

from benchmarks.models import mlp
from core import GradientAccumulationConfig, create_optimized_training_optimizer
from core.loop.epoch import StepLoop


def _batches(steps: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(64, 256, generator=g).to(device), torch.randint(0, 10, (64,)).to(device))
        for _ in range(2 * steps)
    ]


def hand_seconds(batches: list[Any], device: torch.device) -> float:
    model = mlp().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    loss_fn = nn.CrossEntropyLoss()
    started = time.perf_counter()
    for index, (x, y) in enumerate(batches):
        (loss_fn(model(x), y) / 2).backward()
        if index % 2:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def core_profile(batches: list[Any], profile: cProfile.Profile) -> float:
    original, seconds = StepLoop.run_epoch, [0.0]

    @functools.wraps(original)
    def run_epoch(self: StepLoop, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        profile.enable()
        try:
            return original(self, *args, **kwargs)
        finally:
            profile.disable()
            seconds[0] += time.perf_counter() - started

    StepLoop.run_epoch = run_epoch  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as logs:
            run = create_optimized_training_optimizer(
                model=mlp(), train_loader=batches, max_epochs=1, learning_rate=1e-4,
                max_grad_norm=1.0, log_dir=logs, checkpoint_every_n_epochs=None,
                progress=False, reports=False, enable_amp=False,
                gradient_accumulation_config=GradientAccumulationConfig(2),
            )  # fmt: skip
            anyio.run(run.train)
            run.close()
    finally:
        StepLoop.run_epoch = original  # type: ignore[method-assign]
    return seconds[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = _batches(args.steps, device)
    hand_seconds(batches, device)  # warm-up
    hand = hand_seconds(batches, device)
    profile = cProfile.Profile()
    core_profile(batches, cProfile.Profile())  # warm-up
    core = core_profile(batches, profile)
    print(f"device {device}: {args.steps} steps; hand {hand / args.steps * 1e3:.3f} ms a step, "
          f"core's epoch (profiled) {core / args.steps * 1e3:.3f} ms a step")  # fmt: skip
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
