"""Input pipeline throughput: ``create_dataloader`` with ``LoaderConfig()`` (auto workers)
against ``num_workers=0``, and a ``CachedDataset``'s first epoch (filling) against its second.

Each sample is a 3x64x64 image run through a CPU-heavy pure-torch transform (three 3x3
convolutions, an FFT filter: about 2 ms on one core). torch's intra-op threads are set
to 1 here, in the training process; torch sets 1 in each DataLoader worker itself. So the
figures compare processes, not intra-op thread pools. Other processes busy on the same cores
skew the ratios: the load average is printed with the figures.

Two consumers of the batches:
- ``iterate``: draws the batches and does nothing else (pure loader throughput);
- ``step``: also spends, per batch, a stand-in training step in the training process costing
  about what loading that batch costs in-process (the same transform once per sample), as a
  model training on the CPU does. Workers overlap loading with it; ``num_workers=0`` cannot.

Each round builds fresh loaders (worker start-up included), alternating the two, and the median
of ``--rounds`` is printed. The cache rows time one in-process epoch that fills a
``CachedDataset`` (the transform per index, then a random flip) and the next, cached, one.

    python -m benchmarks.loader                # defaults: 1024 samples, batch 32, 3 rounds
    python -m benchmarks.loader --workers 2    # compare num_workers=2 instead of auto
    python -m benchmarks.loader --dry-run      # a few samples, one round: checks it runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from core.data import CachedDataset, LoaderConfig, auto_num_workers, create_dataloader
from core.data.loader import usable_cores

Sample = tuple[torch.Tensor, torch.Tensor]

_g = torch.Generator().manual_seed(0)
W1 = torch.randn(24, 3, 3, 3, generator=_g) * 0.1
W2 = torch.randn(24, 24, 3, 3, generator=_g) * 0.1
W3 = torch.randn(3, 24, 3, 3, generator=_g) * 0.1


def prepare(image: torch.Tensor) -> torch.Tensor:
    """The slow, deterministic per-sample transform ("decode + resize" stand-in)."""
    h = image.float().div(255).unsqueeze(0)
    h = F.conv2d(h, W1, padding=1).relu()
    h = F.conv2d(h, W2, padding=1).relu()
    h = F.conv2d(h, W3, padding=1)
    spectrum = torch.fft.rfft2(h)
    h = torch.fft.irfft2(spectrum * spectrum.abs().clamp(max=1), s=h.shape[-2:])
    return h[0]


def prepare_sample(sample: Sample) -> Sample:
    image, label = sample
    return prepare(image), label


def random_flip(sample: Sample) -> Sample:
    image, label = sample
    return (image.flip(-1) if torch.rand(()) < 0.5 else image), label


class RawImages(Dataset[Sample]):
    """uint8 images as a decoder would hand them over, with integer labels."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.images = torch.randint(0, 256, (n, 3, 64, 64), generator=g, dtype=torch.uint8)
        self.labels = torch.arange(n) % 10

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Sample:
        return self.images[index], self.labels[index]


class SlowImages(RawImages):
    """The same images, prepared on every access (no cache)."""

    def __getitem__(self, index: int) -> Sample:
        return prepare_sample(super().__getitem__(index))


def stand_in_step(batch: Sample) -> None:
    for image in batch[0]:
        prepare(image)


def epoch_seconds(loader: Iterable[Sample], step: Callable[[Sample], None] | None) -> float:
    start = time.perf_counter()
    for batch in loader:
        if step is not None:
            step(batch)
    return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict[str, Any]:
    data = SlowImages(args.samples)
    device = torch.device("cpu")
    parallel = LoaderConfig() if args.workers is None else LoaderConfig(num_workers=args.workers)
    configs = {"inline": LoaderConfig(num_workers=0), "parallel": parallel}
    speeds: dict[tuple[str, str], list[float]] = {}
    workers: dict[str, int] = {}
    for _ in range(args.rounds):
        for consumer, step in (("iterate", None), ("step", stand_in_step)):
            for name, config in configs.items():
                loader = create_dataloader(data, args.batch_size, device=device, config=config)
                workers[name] = loader.num_workers
                seconds = epoch_seconds(loader, step)
                del loader  # ends persistent workers before the next measurement
                speeds.setdefault((name, consumer), []).append(args.samples / seconds)
    cached = CachedDataset(RawImages(args.samples), prepare_sample, random_flip)
    inline = LoaderConfig(num_workers=0)
    cache_loader = create_dataloader(cached, args.batch_size, shuffle=True, config=inline)
    first, second = epoch_seconds(cache_loader, None), epoch_seconds(cache_loader, None)
    return {
        "speeds": {key: statistics.median(values) for key, values in speeds.items()},
        "workers": workers,
        "cache_s": (first, second),
        "cache_mib": cached.nbytes() / 2**20,
    }


def transform_ms(repeats: int) -> float:
    image = RawImages(1)[0][0]
    for _ in range(5):
        prepare(image)
    start = time.perf_counter()
    for _ in range(repeats):
        prepare(image)
    return 1000 * (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None, help="instead of auto (-1)")
    parser.add_argument("--dry-run", action="store_true", help="64 samples, one round")
    args = parser.parse_args()
    if args.dry_run:
        args.samples, args.batch_size, args.rounds = 64, 16, 1
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    print(
        f"{usable_cores()} usable cores, auto_num_workers(cpu)={auto_num_workers(cpu)}, "
        f"torch threads 1, transform {transform_ms(10 if args.dry_run else 200):.2f} ms/sample, "
        f"{args.samples} samples, batch {args.batch_size}, median of {args.rounds} round(s)\n"
    )
    load_before = os.getloadavg()[0]
    result = measure(args)
    speeds, workers = result["speeds"], result["workers"]
    label = "LoaderConfig()" if args.workers is None else f"num_workers={args.workers}"
    print("| loader | consumer | workers | samples/s | vs num_workers=0 |")
    print("| --- | --- | ---: | ---: | ---: |")
    for consumer in ("iterate", "step"):
        base = speeds[("inline", consumer)]
        for name, shown in (("inline", "num_workers=0"), ("parallel", label)):
            speed = speeds[(name, consumer)]
            print(f"| {shown} | {consumer} | {workers[name]} | {speed:.0f} | {speed / base:.2f}x |")
    first, second = result["cache_s"]
    print("\n| CachedDataset (num_workers=0) | seconds | samples/s |")
    print("| --- | ---: | ---: |")
    print(f"| epoch 1 (fills the cache) | {first:.3f} | {args.samples / first:.0f} |")
    print(f"| epoch 2 (cached, augment only) | {second:.3f} | {args.samples / second:.0f} |")
    print(
        f"\ncached epoch {first / second:.1f}x faster; the cache holds "
        f"{result['cache_mib']:.1f} MiB"
    )
    # Other processes competing for the cores skew the ratios: say how busy the machine was.
    print(f"1-minute load average: {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
