"""The GPU suite's speed cases: core's overhead against a hand-written loop, precision
throughput and memory, and the model FLOPs utilisation of a GPT-2-medium-shaped model.
"""

from __future__ import annotations

import copy
import statistics
from functools import partial
from typing import Any

import torch
from torch import nn

from benchmarks import compile as compile_bench
from benchmarks import overhead
from benchmarks.gpu_suite_rows import Ctx, Row, core_run, judged, namespace, skipped
from benchmarks.models import GPT, resnet
from core.transforms import compile_model

__all__ = ("matmul_tflops", "mfu", "overhead_case", "precision")


def overhead_case(ctx: Ctx) -> list[Row]:
    """core / hand-written loop (``benchmarks.overhead``) on GPT-2 small in bf16 and on the
    small MLP, alternating in rounds, start-up of each ``train()`` call included."""
    jobs = {
        "gpt2": (0.99, dict(precision="bf16", batch_size=8, seq_len=1024, accum=1, steps=100)),
        "mlp": (0.97, dict(precision="fp32", batch_size=64, seq_len=0, accum=2, steps=300)),
    }
    rows = []
    for name, (goal, full) in jobs.items():
        sizes = full
        if ctx.dry_run:
            sizes = {**full, "precision": "fp32", "batch_size": 4, "seq_len": 16, "steps": 2}
        args = namespace(
            model=name,
            epochs=1,
            checkpoint_every_n_epochs=None,
            no_monitor=False,
            user_surface=False,
            **sizes,
        )
        rounds = 1 if ctx.dry_run else (3 if name == "gpt2" else 5)
        model, batches = overhead.make_job(args, ctx.device)
        overhead.hand_loop(copy.deepcopy(model), batches[: 4 * args.accum], args, ctx.device)
        overhead.ours(copy.deepcopy(model), batches[: 4 * args.accum], args, ctx.tmp)
        seconds: dict[str, list[float]] = {"hand": [], "core": []}
        for round_ in range(rounds):
            for label in ("hand", "core") if round_ % 2 == 0 else ("core", "hand"):
                replica = copy.deepcopy(model)
                if label == "hand":
                    run = partial(overhead.hand_loop, replica, batches, args, ctx.device)
                else:
                    run = partial(overhead.ours, replica, batches, args, ctx.tmp)
                seconds[label].append(overhead.timed(run, ctx.device))
        ratio = statistics.median(seconds["hand"]) / statistics.median(seconds["core"])
        note = (
            f"{args.precision}, batch {args.batch_size}x{args.accum}, {args.steps} steps, "
            f"median of {rounds} rounds, start-up included"
        )
        rows.append(
            judged(
                ctx, "overhead", f"{name}: core / hand-written", ratio, goal, note=note, digits=4
            )
        )
    return rows


PRECISIONS = {  # label: (amp_dtype, tf32)
    "fp32 strict": ("fp32", False),
    "tf32": ("fp32", True),
    "bf16": ("bf16", True),
    "fp16": ("fp16", True),
}


def _precision_jobs(ctx: Ctx) -> dict[str, tuple[nn.Module, list[Any], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    gpt_sizes: dict[str, int] = (
        {} if not ctx.dry_run else dict(vocab=256, ctx=16, d=32, layers=1, heads=2)
    )
    gpt = GPT(**gpt_sizes)
    b, t = (2, 16) if ctx.dry_run else (8, 1024)
    tokens = torch.randint(gpt.tok.num_embeddings, (b, t + 1), generator=g).to(ctx.device)
    cnn = resnet((1, 1, 1, 1), width=8, classes=10) if ctx.dry_run else resnet()
    n, side = (4, 32) if ctx.dry_run else (64, 224)
    images = torch.randn(n, 3, side, side, generator=g).to(ctx.device)
    labels = torch.randint(10, (n,), generator=g).to(ctx.device)
    steps = 2 if ctx.dry_run else 10
    return {
        "gpt2-small": (gpt.to(ctx.device), [(tokens[:, :-1], tokens[:, 1:])] * steps, {}),
        "resnet50": (cnn.to(ctx.device), [(images, labels)] * steps, {"channels_last": True}),
    }


def precision(ctx: Ctx) -> list[Row]:
    """Samples/s (last of two epochs) and peak memory through core in strict fp32, TF32,
    bf16 and fp16, on GPT-2 small and a ResNet-50-shaped CNN (channels_last)."""
    rows = []
    for name, (model, batches, extra) in _precision_jobs(ctx).items():
        rates: dict[str, float] = {}
        for label, (dtype, tf32) in PRECISIONS.items():
            figure = f"{name}: {label} samples/s"
            if not ctx.cuda and label in ("tf32", "fp16"):
                rows.append(skipped("precision", figure, "needs CUDA (TF32, fp16 autocast)"))
                continue
            rate, peak = core_run(
                ctx, copy.deepcopy(model), batches, amp_dtype=dtype, tf32=tf32, **extra
            )
            rates[label] = rate
            memory = "peak memory -" if peak is None else f"peak memory {peak / 2**30:.2f} GiB"
            rows.append(judged(ctx, "precision", figure, rate, note=memory, digits=1))
        for base, goal in (("fp32 strict", 4.0), ("tf32", 1.6)):
            figure = f"{name}: bf16 / {base}"
            if base in rates and "bf16" in rates:
                ratio = rates["bf16"] / rates[base]
                rows.append(judged(ctx, "precision", figure, ratio, goal, unit="x"))
            else:
                rows.append(skipped("precision", figure, f"{base} not measured", f">= {goal}x"))
    return rows


def matmul_tflops(ctx: Ctx) -> float:
    """The measured rate of a large bf16 matmul (8192^3 on CUDA; 256^3 fp32 in a dry run)."""
    n, dtype = (256, torch.float32) if ctx.dry_run else (8192, torch.bfloat16)
    a = torch.randn(n, n, device=ctx.device, dtype=dtype)
    b = torch.randn(n, n, device=ctx.device, dtype=dtype)
    reps = 3 if ctx.dry_run else 20
    for _ in range(3):
        a @ b
    seconds = compile_bench.timed(lambda: (a @ b, None)[1], reps, ctx.device)
    return 2 * n**3 * reps / seconds / 1e12


def mfu(ctx: Ctx) -> list[Row]:
    """Model FLOPs utilisation of a compiled GPT-2-medium shape (d 1024, 24 layers, 16 heads,
    T 1024) in bf16: tokens/s x (6N + 12 L H Q T) against the measured bf16 matmul rate."""
    if ctx.dry_run:
        sizes = dict(vocab=256, ctx=32, d=64, layers=2, heads=2)
        batch, backend = 2, "eager"
    else:
        sizes, batch, backend = dict(ctx=1024, d=1024, layers=24, heads=16), 8, "inductor"
    torch.manual_seed(0)
    model = GPT(**sizes).to(ctx.device)
    t = sizes["ctx"]
    tokens = torch.randint(model.tok.num_embeddings, (batch, t + 1), device=ctx.device)
    errors: list[dict[str, Any]] = []

    def ignore(event: str, /, **fields: Any) -> None:
        pass

    def report(event: str, /, **fields: Any) -> None:
        errors.append(fields)

    compile_model(model, backend=backend, emit=ignore, report_error=report)
    args = namespace(precision="bf16" if ctx.cuda else "fp32")
    step = compile_bench.trainer(model, (tokens[:, :-1], tokens[:, 1:]), args)
    compile_bench.timed(step, 1 if ctx.dry_run else 3, ctx.device)  # compiles, warms up
    steps = 2 if ctx.dry_run else 10
    seconds = compile_bench.timed(step, steps, ctx.device)
    tokens_per_s = batch * t * steps / seconds
    n = sum(p.numel() for p in model.parameters()) - model.pos.weight.numel()
    layers, heads, d = sizes["layers"], sizes["heads"], sizes["d"]
    flops_per_token = 6 * n + 12 * layers * heads * (d // heads) * t
    achieved = tokens_per_s * flops_per_token / 1e12
    peak = matmul_tflops(ctx)
    note = f"{n / 1e6:.0f}M non-embedding-position params, batch {batch}x{t}, compiled ({backend})"
    if errors:
        note += f", compile failed (ran eagerly): {errors[0]}"
    return [
        judged(ctx, "mfu", "achieved model TFLOP/s", achieved, note=note, digits=1),
        judged(
            ctx,
            "mfu",
            "matmul TFLOP/s (8192^3 bf16)",
            peak,
            digits=1,
            note="dry run: 256^3 fp32" if ctx.dry_run else "",
        ),
        judged(ctx, "mfu", "MFU = achieved / matmul", achieved / peak, 0.45, digits=3),
    ]
