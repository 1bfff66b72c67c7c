"""Where the host time of core's optimizer steps goes, on this machine's device: the step
thread's own calls under ``cProfile`` (a profiler sees only the thread that enables it, so
it is enabled inside core's step thread), for the MLP of ``benchmarks.overhead`` (fp32,
batch 64, clip 1.0), beside the same steps of a hand-written loop, timed.

First it prints **core's Python calls per optimizer step**: the calls of functions defined
in ``core/`` (generators resumed and comprehensions included, as cProfile counts them), in
an epoch of ``2 x steps`` less an epoch of ``steps``, over ``steps``, so what an epoch pays
once (opening it, the last flush) is not spread over its steps. Then the table.

    python -m benchmarks.step_profile                    # 300 steps, top 30 by own time
    python -m benchmarks.step_profile --accumulation 2   # windows of two batches
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
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn

import core
from benchmarks.models import mlp
from core import GradientAccumulationConfig, create_optimized_training_optimizer
from core.loop.epoch import StepLoop

CORE = str(Path(core.__file__).parent)


def _batches(
    steps: int, accumulation: int, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(64, 256, generator=g).to(device), torch.randint(0, 10, (64,)).to(device))
        for _ in range(accumulation * steps)
    ]


def core_calls(profile: cProfile.Profile) -> int:
    """Calls of functions defined in ``core/`` that ``profile`` saw."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return sum(calls for (path, _, _), (_, calls, *_) in stats.items() if path.startswith(CORE))


def hand_seconds(batches: list[Any], accumulation: int, device: torch.device) -> float:
    model = mlp().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    loss_fn = nn.CrossEntropyLoss()
    started = time.perf_counter()
    for index, (x, y) in enumerate(batches):
        loss = loss_fn(model(x), y)
        (loss if accumulation == 1 else loss / accumulation).backward()
        if (index + 1) % accumulation == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def core_profile(batches: list[Any], accumulation: int, profile: cProfile.Profile) -> float:
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
                model=mlp(),
                train_loader=batches,
                max_epochs=1,
                learning_rate=1e-4,
                max_grad_norm=1.0,
                log_dir=logs,
                checkpoint_every_n_epochs=None,
                progress=False,
                reports=False,
                enable_amp=False,
                gradient_accumulation_config=GradientAccumulationConfig(accumulation),
            )
            anyio.run(run.train)
            run.close()
    finally:
        StepLoop.run_epoch = original  # type: ignore[method-assign]
    return seconds[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    steps, accumulation = args.steps, args.accumulation
    batches = _batches(2 * steps, accumulation, device)
    hand_seconds(batches, accumulation, device)  # warm-up
    hand = hand_seconds(batches, accumulation, device)
    core_profile(batches, accumulation, cProfile.Profile())  # warm-up
    short = cProfile.Profile()
    core_profile(batches[: steps * accumulation], accumulation, short)
    profile = cProfile.Profile()
    core = core_profile(batches, accumulation, profile)
    per_step = (core_calls(profile) - core_calls(short)) / steps
    per_epoch = core_calls(short) - per_step * steps
    print(
        f"core's Python calls per optimizer step: {per_step:.1f} (and {per_epoch:.0f} per "
        f"epoch); accumulation {accumulation}, fp32, clip 1.0"
    )
    print(
        f"device {device}: {2 * steps} steps; hand {hand / (2 * steps) * 1e3:.3f} ms a step, "
        f"core's epoch (profiled) {core / (2 * steps) * 1e3:.3f} ms a step"
    )
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
