"""Per-step overhead of `await optimizer.train()` against a hand-written PyTorch loop.

Both train the same model (same initial weights) on the same batches with the same
optimizer (fused AdamW), precision, accumulation and clipping, alternated in one process.
Each round is one job of ``--epochs`` epochs: for core, one ``await optimizer.train()`` call,
start-up included (building the optimizer, the run directory, the worker thread), with the
GPU monitor on and checkpoints off unless asked for (the hand-written loop saves nothing).
Prints the median samples/s of each and their ratio.

With ``--peers``, the same hand-written loop also runs through Lightning Fabric and Hugging
Face Accelerate (``benchmarks.peers``; optional packages), alternated with the others in
each round, and their ratios to the hand-written loop are printed as extra rows ("not
installed" where the package cannot be imported).

    python benchmarks/overhead.py                      # small MLP on this machine's device
    python benchmarks/overhead.py --peers              # and Fabric, Accelerate beside them
    python benchmarks/overhead.py --model gpt2 --precision bf16 --sync-check   # on a GPU
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn

from benchmarks.models import GPT, mlp
from benchmarks.peers import PEERS, Peer, quiet
from core import GradientAccumulationConfig, MultiGPUConfig, create_optimized_training_optimizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
Batch = tuple[torch.Tensor, torch.Tensor]


def make_job(args: argparse.Namespace, device: torch.device) -> tuple[nn.Module, list[Batch]]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if args.model == "gpt2":
        # GPT-2 small on a GPU; a miniature of the same shape elsewhere (to exercise the path).
        sizes = {} if device.type == "cuda" else {"vocab": 512, "d": 64, "layers": 2, "heads": 2}
        model: nn.Module = GPT(ctx=args.seq_len, **sizes)
        vocab = sizes.get("vocab", 50304)
        batches = []
        for _ in range(args.steps * args.accum):
            tokens = torch.randint(vocab, (args.batch_size, args.seq_len + 1), generator=g)
            batches.append((tokens[:, :-1].to(device), tokens[:, 1:].to(device)))
    else:
        model = mlp()
        batches = [
            (
                torch.randn(args.batch_size, 256, generator=g),
                torch.randint(10, (args.batch_size,), generator=g),
            )
            for _ in range(args.steps * args.accum)
        ]
        batches = [(x.to(device), y.to(device)) for x, y in batches]
    return model.to(device), batches


def hand_loop(
    model: nn.Module, batches: Sequence[Batch], args: argparse.Namespace, device: torch.device
) -> None:
    """The nanoGPT shape: autocast context, GradScaler for fp16, clip, step, zero_grad."""
    dtype = DTYPES[args.precision]
    ctx = nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(args.epochs):
        hand_epoch(model, batches, args, ctx, scaler, optimizer, loss_fn)


def hand_epoch(
    model: nn.Module,
    batches: Sequence[Batch],
    args: argparse.Namespace,
    ctx: Any,
    scaler: torch.amp.GradScaler,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
) -> None:
    for start in range(0, len(batches), args.accum):
        window = batches[start : start + args.accum]
        window_samples = sum(len(y) for _, y in window)
        for x, y in window:
            with ctx:
                loss = loss_fn(model(x), y) * (len(y) / window_samples)
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)


def ours(
    model: nn.Module,
    batches: Sequence[Batch],
    args: argparse.Namespace,
    log_dir: Path,
    **settings: Any,
) -> None:
    """One ``train()`` call through core, start-up and close included. ``compile=False``:
    the hand-written loop runs eagerly, so core must too (like for like); ``settings`` go
    to the factory as well (the GPU suite passes ``tf32=``)."""
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=batches,
        max_epochs=args.epochs,
        learning_rate=1e-4,
        amp_dtype=DTYPES[args.precision],
        gradient_accumulation_config=GradientAccumulationConfig(accumulation_steps=args.accum),
        max_grad_norm=1.0,
        log_dir=log_dir,
        experiment_name="overhead",
        checkpoint_every_n_epochs=args.checkpoint_every_n_epochs,
        multi_gpu_config=MultiGPUConfig(enable_gpu_monitoring=not args.no_monitor),
        progress=args.user_surface,
        reports=args.user_surface,
        compile=False,
        **settings,
    )
    try:
        anyio.run(optimizer.train)
    finally:
        optimizer.close()


def peer_run(
    peer: Peer,
    model: nn.Module,
    batches: Sequence[Batch],
    args: argparse.Namespace,
    device: torch.device,
) -> None:
    peer.loop(model, batches, args.epochs, args.accum, args.precision, device)


def timed(fn: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()  # timing boundary only, outside both loops
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "gpt2"], default="mlp")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=list(DTYPES), default="fp32")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per round (one job)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument(
        "--sync-check", action="store_true", help="CUDA: fail on any host sync in our loop"
    )
    parser.add_argument(
        "--checkpoint-every-n-epochs",
        type=int,
        default=None,
        help="core's default is 1; off here, as the hand-written loop saves nothing",
    )
    parser.add_argument("--no-monitor", action="store_true", help="switch the GPU monitor off")
    parser.add_argument(
        "--user-surface",
        action="store_true",
        help="the defaults a user gets: progress lines on stderr and the end-of-run reports "
        "(off otherwise: the table measures the step loop)",
    )
    parser.add_argument(
        "--peers",
        nargs="*",
        choices=list(PEERS),
        default=None,
        help="also run the hand-written loop through these frameworks (no names: all)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.peers is not None and not args.peers:
        args.peers = list(PEERS)
    peers = [PEERS[name] for name in args.peers or []]
    running = [peer for peer in peers if peer.installed]
    if running:
        quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, batches = make_job(args, device)
    samples = args.epochs * sum(len(y) for _, y in batches)
    names = ["hand", "core"] + [peer.name for peer in running]
    results: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        warm = copy.deepcopy(model)
        warm_up = batches[: 4 * args.accum]  # allocator, kernels, lazy imports
        hand_loop(warm, warm_up, args, device)
        ours(copy.deepcopy(model), warm_up, args, Path(tmp))
        for peer in running:
            peer_run(peer, copy.deepcopy(model), warm_up, args, device)
        for round_ in range(args.rounds):
            shift = round_ % len(names)  # every job takes every place in the order in turn
            order = names[shift:] + names[:shift]
            for name in order:
                replica = copy.deepcopy(model)
                if name == "hand":
                    seconds = timed(partial(hand_loop, replica, batches, args, device), device)
                elif name in PEERS:
                    run = partial(peer_run, PEERS[name], replica, batches, args, device)
                    seconds = timed(run, device)
                else:
                    check = args.sync_check and device.type == "cuda"
                    if check:
                        torch.cuda.set_sync_debug_mode("error")
                    try:
                        seconds = timed(partial(ours, replica, batches, args, Path(tmp)), device)
                    finally:
                        if check:
                            torch.cuda.set_sync_debug_mode("default")
                results[name].append(samples / seconds)
    hand, core = statistics.median(results["hand"]), statistics.median(results["core"])
    summary: dict[str, Any] = {
        "model": args.model,
        "device": str(device),
        "precision": args.precision,
        "batch_size": args.batch_size,
        "accum": args.accum,
        "steps_per_epoch": args.steps,
        "epochs_per_round": args.epochs,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "checkpoint_every_n_epochs": args.checkpoint_every_n_epochs,
        "monitor": not args.no_monitor,
        "hand_samples_per_s": round(hand, 1),
        "core_samples_per_s": round(core, 1),
        "ratio": round(core / hand, 4),
        "hand_ms_per_step": round(1000 * args.batch_size * args.accum / hand, 3),
        "core_ms_per_step": round(1000 * args.batch_size * args.accum / core, 3),
        "hand_round_s": [round(samples / x, 3) for x in results["hand"]],
        "core_round_s": [round(samples / x, 3) for x in results["core"]],
    }
    rows: dict[str, Any] = {}
    for peer in peers:
        if not peer.installed:
            summary[f"{peer.name}_ratio"] = None
            rows[f"{peer.label} / hand-written"] = "not installed"
            continue
        speed = statistics.median(results[peer.name])
        summary[f"{peer.name}_samples_per_s"] = round(speed, 1)
        summary[f"{peer.name}_ratio"] = round(speed / hand, 4)
        summary[f"{peer.name}_ms_per_step"] = round(1000 * args.batch_size * args.accum / speed, 3)
        summary[f"{peer.name}_round_s"] = [round(samples / x, 3) for x in results[peer.name]]
        rows[f"{peer.label} / hand-written"] = summary[f"{peer.name}_ratio"]
    if peers:
        rows = {"core / hand-written": summary["ratio"], **rows}
    width = max(len(key) for key in [*summary, *rows])
    for key, value in summary.items():
        print(f"{key:>{width}}: {value}")
    for key, value in rows.items():
        print(f"{key:>{width}}: {value}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
