"""The GPU suite's tool cases: compile against eager, activation checkpointing, the batch-size
finder, the GPU monitor's cost, and DDP at world size 1 against one GPU.
"""

from __future__ import annotations

import copy
import math
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks import activation_checkpointing as ac_bench
from benchmarks import batch_size_finder as finder_bench
from benchmarks import compile as compile_bench
from benchmarks import distributed as ddp_bench
from benchmarks import monitor as monitor_bench
from benchmarks import monitor_sample_cost
from benchmarks.gpu_suite_rows import Ctx, Row, judged, namespace, rounds
from benchmarks.overhead import make_job

__all__ = ("activation_checkpointing", "batch_size_finder", "compile_case", "ddp", "monitor")


def compile_case(ctx: Ctx) -> list[Row]:
    """Training steps/s compiled / eager on GPT-2 small (8 x 1024) in bf16, three ways
    (``benchmarks.compile --scope all``): the model compiled as core's ``compile=True`` does,
    the model with its loss, and forward with backward (compiled autograd); fused AdamW,
    loss over the flattened tokens, 3 alternating rounds of 10 steps after 3 to warm up."""
    args = namespace(
        dry_run=ctx.dry_run,
        batch_size=0,
        mode="default",
        scope="all",
        precision="bf16" if ctx.cuda else "fp32",
        backend="eager" if ctx.dry_run else "inductor",
        steps=2 if ctx.dry_run else 10,
        warmup=1 if ctx.dry_run else 3,
        rounds=1 if ctx.dry_run else 3,
    )
    if ctx.cuda:
        torch.set_float32_matmul_precision("high")  # as core's tf32=True (restored after)
    rows = []
    for row in compile_bench.measure("gpt", args, ctx.device):
        batch = row["batch"] if ctx.dry_run else f"{row['batch']}x1024"
        note = (
            f"{row['params_M']:.0f}M params, batch {batch}, {args.precision}, backend "
            f"{args.backend}, first step {row['first_step_s']:.1f} s, graph breaks "
            f"{row['graph_breaks']}, {args.rounds}x{args.steps} timed steps"
        )
        if row["failed"]:
            note += f"; compile failed, ran eagerly: {row['failed']}"
        name = f"gpt2-small: {row['scope']} compiled / eager"
        rows.append(judged(ctx, "compile", name, row["ratio"], 1.15, note=note))
    return rows


def activation_checkpointing(ctx: Ctx) -> list[Row]:
    """Activation memory saved and step time cost of activation checkpointing on the email
    transformer (``benchmarks.activation_checkpointing``)."""
    args = namespace(
        dry_run=ctx.dry_run,
        batch_size=8 if ctx.dry_run else 256,
        steps=2 if ctx.dry_run else 10,
        rounds=1 if ctx.dry_run else 3,
    )
    row: dict[Any, Any] = ac_bench.measure(args, 2, ctx.device)  # keyed by checkpointing
    plain, ac = row[False], row[True]
    saved = 1 - ac["activation"] / plain["activation"] if plain["activation"] else None
    note = (
        f"activation {plain['activation'] / 2**20:.1f} -> {ac['activation'] / 2**20:.1f} "
        f"MiB, batch {args.batch_size}, 2 layers"
    )
    time_note = f"{row['ms'][False]:.1f} -> {row['ms'][True]:.1f} ms per step"
    return [
        judged(ctx, "activation_checkpointing", "activation memory saved", saved, note=note),
        judged(
            ctx,
            "activation_checkpointing",
            "step time AC / plain",
            row["ms"][True] / row["ms"][False],
            note=time_note,
        ),
    ]


def batch_size_finder(ctx: Ctx) -> list[Row]:
    """The size ``find_batch_size`` picks against the true maximum (real trials around it),
    and its number of trials (``benchmarks.batch_size_finder``)."""
    name, budget = ("mlp", 0.02) if ctx.dry_run else ("email", 2.0)
    (case,) = finder_bench.cases(ctx.dry_run, [name])
    x, y = case.batch
    case = finder_bench.Case(
        case.name, case.model.to(ctx.device), (x.to(ctx.device), y.to(ctx.device))
    )
    row = finder_bench.run_case(case, budget, 1 << 18)
    found, true_max = row["found"], row["true_max"]
    exact = 1.0 if found == true_max else 0.0
    note = (
        f"{case.name}, budget {budget:g} GiB, found {found}, true max {true_max} "
        f"({row['swept']} sizes swept)"
    )
    if not row["monotone"]:
        note += ", not monotone"
    return [
        judged(
            ctx,
            "batch_size_finder",
            "found = true max (1 yes, 0 no)",
            exact,
            1.0,
            note=note,
            digits=0,
        ),
        judged(
            ctx,
            "batch_size_finder",
            "trials",
            row["trials"],
            digits=0,
            note=f"sizes tried {row['sizes_tried']}, search {row['search_s']} s",
        ),
    ]


def monitor(ctx: Ctx) -> list[Row]:
    """Throughput with the monitor at 10 Hz / monitor off on the MLP (``benchmarks.monitor``;
    150 steps x 2 micro-batches x 2 epochs per run, up to 5 alternating rounds), and one
    monitor sample's cost (``benchmarks.monitor_sample_cost``)."""
    args = namespace(
        model="mlp",
        precision="fp32",
        batch_size=8 if ctx.dry_run else 64,
        seq_len=0,
        accum=2,
        steps=2 if ctx.dry_run else 150,
        epochs=1 if ctx.dry_run else 2,
    )
    quiet = {
        "progress": False,
        "reports": False,
        "checkpoint_every_n_epochs": None,
        "compile": False,  # the figure is the monitor's cost, not compilation's
    }
    model, batches = make_job(args, ctx.device)
    samples = args.epochs * sum(len(y) for _, y in batches)
    rates: dict[bool, list[float]] = {True: [], False: []}
    monitor_bench.job(copy.deepcopy(model), batches[:4], args, True, ctx.tmp, **quiet)  # warm
    for round_ in rounds(ctx, 5):
        for monitored in (True, False) if round_ % 2 == 0 else (False, True):
            replica = copy.deepcopy(model)
            seconds = monitor_bench.job(replica, batches, args, monitored, ctx.tmp, **quiet)
            rates[monitored].append(samples / seconds)
    done = len(rates[True])
    ratio = statistics.median(rates[True]) / statistics.median(rates[False])
    cost = monitor_sample_cost.measure(100 if ctx.dry_run else 2000, None)
    source = f"source {cost['source']}, devices {cost['devices']}"
    if cost["degraded_reason"]:
        source += f", degraded: {cost['degraded_reason']}"
    return [
        judged(
            ctx,
            "monitor",
            "mlp: 10 Hz monitor / off",
            ratio,
            0.998,
            digits=4,
            note=f"{args.steps}x{args.accum} steps, {args.epochs} epochs, {done} rounds",
        ),
        judged(
            ctx,
            "monitor",
            "one sample, median us",
            cost["median_us"],
            digits=1,
            note=f"p90 {cost['p90_us']:.1f} us, {source}",
        ),
    ]


def ddp(ctx: Ctx) -> list[Row]:
    """DDP at world size 1 / the single-device path, both through core (``compile=False``),
    under torchrun (``benchmarks.distributed`` launches it, PYTHONPATH kept): the MLP, 100
    steps x 2 epochs per job, 3 alternating rounds."""
    args = namespace(
        rounds=1 if ctx.dry_run else 3,
        steps=2 if ctx.dry_run else 100,
        epochs=1 if ctx.dry_run else 2,
        threads=1 if not ctx.cuda else 0,
        batch_size=8 if ctx.dry_run else 64,
        precision="auto",
        quiet=True,
    )
    left = ctx.left()  # torchrun is stopped (workers too) before the budget's alarm
    timeout = max(1.0, left - 2) if math.isfinite(left) else None
    one = ddp_bench.launch(1, args, Path(ctx.tmp) / "ddp_one.json", timeout=timeout)
    single = "single_gpu" if "single_gpu" in one else "cpu"
    note = (
        f"MLP, batch {args.batch_size}, {args.steps} steps x {args.epochs} epochs, "
        f"median of {args.rounds} rounds; hand-written DDP/plain "
        f"{one['hand_ddp'] / one['hand']:.4f}"
    )
    ratio = one["distributed"] / one[single]
    return [judged(ctx, "ddp", f"world size 1 / {single}", ratio, 0.97, note=note, digits=4)]
