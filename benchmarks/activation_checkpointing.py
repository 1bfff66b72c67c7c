"""Peak memory and step time of one training step, without and with activation checkpointing
(``core.transforms.apply_activation_checkpointing``), for the email-sequence transformer.

Memory is measured over one training step (zero_grad, forward, cross-entropy, backward, AdamW
step) after a warm-up step has created the optimizer state, by ``core.memory``'s meter: live
tensor storages on CPU (what the step keeps is named as resident), the allocator's peak on
CUDA. Activation memory is
the peak minus what stays after the step: parameters, gradients, optimizer state, the
batch. Step time is the median over alternating rounds, without the meter.

    python -m benchmarks.activation_checkpointing                 # batch 256, default sizes
    python -m benchmarks.activation_checkpointing --layers 2 6    # and a deeper model
    python -m benchmarks.activation_checkpointing --dry-run       # plumbing check
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from core.memory import meter_for
from core.transforms import apply_activation_checkpointing
from examples.email_sequence.model import EmailSequenceModel

MiB = 2**20


def job(
    args: argparse.Namespace, layers: int, device: torch.device
) -> tuple[Callable[[], None], Callable[[], list[torch.Tensor]]]:
    """A training step of a fresh model (the same weights and batch for every variant), and
    the tensors it keeps between steps (weights, gradients, optimizer state, batch)."""
    torch.manual_seed(0)
    sizes = {"d_model": 16, "n_heads": 2} if args.dry_run else {}
    model = EmailSequenceModel(n_layers=layers, **sizes).to(device)
    b, length, s = args.batch_size, model.max_emails, model.subject_len
    g = torch.Generator().manual_seed(0)
    inputs = torch.cat(
        [
            torch.randint(1, model.vocab_size, (b, length, s), generator=g),
            torch.randint(0, 24, (b, length, 1), generator=g),
            torch.randint(0, 31, (b, length, 1), generator=g),
        ],
        dim=-1,
    ).to(device)
    targets = torch.randint(0, 2, (b,), generator=g).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if args.checkpointing:
        apply_activation_checkpointing(model)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    def kept() -> list[torch.Tensor]:
        params = list(model.parameters())
        state = [v for s in optimizer.state.values() for v in s.values()]
        grads = [p.grad for p in params if p.grad is not None]
        return [*params, *grads, *state, inputs, targets]

    return step, kept


def memory(args: argparse.Namespace, layers: int, device: torch.device) -> tuple[int, int]:
    """(peak bytes, bytes kept after the step) of one training step."""
    step, kept = job(args, layers, device)
    step()  # warm-up: optimizer state, allocator
    tensors = [t for t in kept() if isinstance(t, torch.Tensor)]
    kept_bytes = sum(t.untyped_storage().nbytes() for t in {id(t): t for t in tensors}.values())
    reading = meter_for(device).measure(step, resident=tensors)
    return reading.peak_bytes, kept_bytes


def seconds_per_step(step: Callable[[], None], steps: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()  # timing boundary
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()  # timing boundary
    return (time.perf_counter() - start) / steps


def measure(args: argparse.Namespace, layers: int, device: torch.device) -> dict[str, Any]:
    row: dict[str, Any] = {"layers": layers}
    steps = {}
    for checkpointing in (False, True):
        args.checkpointing = checkpointing
        peak, kept = memory(args, layers, device)
        row[checkpointing] = {"peak": peak, "kept": kept, "activation": peak - kept}
        steps[checkpointing] = job(args, layers, device)[0]
        steps[checkpointing]()  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(args.rounds):
        for checkpointing in (False, True) if round_ % 2 == 0 else (True, False):
            times[checkpointing].append(seconds_per_step(steps[checkpointing], args.steps, device))
    row["ms"] = {key: 1000 * statistics.median(value) for key, value in times.items()}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--layers", type=int, nargs="+", default=[2], help="n_layers values")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, 2 steps")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("skipped: --device cuda, but CUDA is not available")
        return
    if args.dry_run:
        args.steps, args.rounds = 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = [measure(args, layers, device) for layers in args.layers]
    how = "live-storage dispatch mode" if device.type == "cpu" else "max_memory_allocated"
    print(
        f"\nEmailSequenceModel, batch {args.batch_size}, {device} ({how}), torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads\n"
    )
    print(
        "| layers | kept MiB | peak MiB plain | peak MiB AC | activation MiB plain "
        "| activation MiB AC | activation saved | step ms plain | step ms AC | time ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        plain, ac = r[False], r[True]
        saved = 1 - ac["activation"] / plain["activation"]
        print(
            f"| {r['layers']} | {plain['kept'] / MiB:.2f} | {plain['peak'] / MiB:.2f} | "
            f"{ac['peak'] / MiB:.2f} | {plain['activation'] / MiB:.2f} | "
            f"{ac['activation'] / MiB:.2f} | {saved:.1%} | {r['ms'][False]:.1f} | "
            f"{r['ms'][True]:.1f} | {r['ms'][True] / r['ms'][False]:.2f} |"
        )


if __name__ == "__main__":
    main()
