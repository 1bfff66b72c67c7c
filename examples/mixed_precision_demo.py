"""fp32 vs bf16 vs fp16 (with loss scaling): speed and peak memory on the device at hand.

The same small transformer-style MLP (seeded, so every precision starts from the same
weights) trains for ``--steps`` optimizer steps through ``MixedPrecisionOptimizer`` (seed
002's epoch face, driving the run's own step code). Peak memory is that of one training
step, read by ``core.memory``'s meter (the CUDA allocator's peak; live tensor storages on
CPU). A table goes to stdout and ``<out>/table.txt``, the numbers to ``<out>/results.json``,
and a bar plot to ``<out>/comparison.png`` (needs matplotlib:
``pip install -e '.[plots]'`` in core's checkout).

    python examples/mixed_precision_demo.py                    # 200 steps per precision
    python examples/mixed_precision_demo.py --quick            # a few steps, a tiny model
    python examples/mixed_precision_demo.py --steps 1000 --out results/amp

On CPU, AMP is not expected to be faster: CPU autocast mostly saves activation memory, and
fp16 has few fast CPU kernels. On recent GPUs bf16/fp16 use tensor cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from core.memory import meter_for
from core.mixed_precision_training import MixedPrecisionConfig, MixedPrecisionOptimizer

PRECISIONS = ("fp32", "bf16", "fp16")
MiB = 2**20


def make_model(width: int, depth: int, features: int, classes: int) -> nn.Module:
    """Transformer-style MLP blocks (LayerNorm, Linear, GELU, Linear) and a classifier."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(features, width)]
    for _ in range(depth):
        layers += [
            nn.LayerNorm(width),
            nn.Linear(width, 4 * width),
            nn.GELU(),
            nn.Linear(4 * width, width),
        ]
    return nn.Sequential(*layers, nn.LayerNorm(width), nn.Linear(width, classes))


def make_batches(
    steps: int, batch_size: int, features: int, classes: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(steps * batch_size, features, generator=generator)
    y = (x[:, :classes] * 3).argmax(dim=1)  # a learnable rule
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size)]


def run_one(precision: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Train ``args.steps`` steps in ``precision``; its speed, peak memory and final loss."""
    model = make_model(args.width, args.depth, args.features, args.classes).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = MixedPrecisionConfig(dtype=precision, enable_grad_scaler=precision == "fp16")
    mp = MixedPrecisionOptimizer(model, optimizer, config, device=device)
    batches = make_batches(args.steps, args.batch_size, args.features, args.classes)
    mp.train_epoch(batches[:2])  # warm-up: optimizer state, kernels, allocator
    epoch = mp.train_epoch(batches)
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    batch = [t.to(device) for t in batches[0]]  # one more step, measured
    reading = meter_for(device).measure(lambda: mp.trainer.train_step(batch), resident=tensors)
    stats = mp.get_amp_stats()
    mp.cleanup()
    return {
        "precision": precision,
        "steps": epoch["steps"],
        "samples_per_s": epoch["samples_per_s"],
        "seconds": epoch["time"],
        "final_loss": epoch["loss"],
        "skipped_steps": epoch["skipped_steps"],
        "peak_mib": (reading.peak_bytes - reading.start_bytes) / MiB,
        "loss_scale": stats["current_scale"],
    }


def table(results: list[dict[str, Any]], device: torch.device) -> str:
    base = results[0]
    lines = [
        f"device: {device}  (peak: one training step, parameters and optimizer state excluded)",
        f"{'precision':<10}{'samples/s':>12}{'speed-up':>10}{'peak MiB':>10}{'memory':>9}"
        f"{'loss':>9}{'skipped':>9}",
    ]
    for r in results:
        speed = r["samples_per_s"] / base["samples_per_s"]
        memory = r["peak_mib"] / base["peak_mib"] if base["peak_mib"] else float("nan")
        lines.append(
            f"{r['precision']:<10}{r['samples_per_s']:>12.0f}{speed:>9.2f}x{r['peak_mib']:>10.2f}"
            f"{memory:>8.0%}{r['final_loss']:>9.4f}{r['skipped_steps']:>9d}"
        )
    if device.type == "cpu":
        lines.append("on CPU, AMP is not expected to be faster: autocast mostly saves memory")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> bool:
    """A bar plot of speed and peak memory; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [r["precision"] for r in results]
    figure, (speed, memory) = plt.subplots(1, 2, figsize=(9, 3.5))
    speed.bar(names, [r["samples_per_s"] for r in results], color="tab:blue")
    speed.set_title("training speed (samples/s)")
    memory.bar(names, [r["peak_mib"] for r in results], color="tab:orange")
    memory.set_title("peak memory of a step (MiB)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run every precision, print the table, write table, JSON and plot under ``args.out``."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    results = [run_one(precision, args, device) for precision in PRECISIONS]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = table(results, device)
    print(text)
    (out / "table.txt").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if plot(results, out / "comparison.png"):
        print(f"plot: {out / 'comparison.png'}")
    else:
        print(
            "plot skipped: matplotlib is not installed (pip install matplotlib, or "
            "pip install -e '.[plots]' in core's checkout)"
        )
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per precision")
    parser.add_argument("--quick", action="store_true", help="a few steps of a tiny model")
    parser.add_argument("--out", default="results/mixed_precision_demo", help="output folder")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    args = parser.parse_args(argv)
    args.width, args.depth, args.features, args.classes, args.batch_size = 64, 2, 64, 10, 512
    if args.quick:
        args.steps = min(args.steps, 8)
        args.width, args.depth, args.batch_size = 32, 1, 128
    return args


async def demonstrate_mixed_precision_training(
    steps: int = 200, out: str = "results/mixed_precision_demo", quick: bool = False
) -> list[dict[str, Any]]:
    """The seed's entry point: the comparison in a worker thread (the event loop stays free)."""
    argv = ["--steps", str(steps), "--out", out, *(["--quick"] if quick else [])]
    return await anyio.to_thread.run_sync(compare, parse_args(argv))


def main(argv: list[str] | None = None) -> None:
    compare(parse_args(argv))


if __name__ == "__main__":
    main()
