"""The GPU suite's speed cases: precision throughput and memory through core, and the model
FLOPs utilisation (MFU) of a GPT-2-medium shape, for a hand-written compiled step and
through core with ``compile=True``.

MFU = tokens/s x (6N + 12 L H Q T) / the measured rate of a large bf16 matmul, with N the
parameters less the position embedding (the tied token embedding counts once, as the
output layer it also is), L layers, H heads, Q the head size and T the context.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from benchmarks import compile as compile_bench
from benchmarks.gpu_suite_rows import Ctx, Row, core_run, judged, namespace, skipped
from benchmarks.models import GPT, resnet
from core.transforms import compile_model

__all__ = ("MFU_BATCH", "matmul_tflops", "mfu", "mfu_core", "precision")


PRECISIONS = {  # label: (amp_dtype, tf32)
    "fp32 strict": ("fp32", False),
    "tf32": ("fp32", True),
    "bf16": ("bf16", True),
    "fp16": ("fp16", True),
}
PRECISION_STEPS = 6  # per epoch; two epochs, the second one's samples/s is the figure


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
    steps = 2 if ctx.dry_run else PRECISION_STEPS
    return {
        "gpt2-small": (gpt.to(ctx.device), [(tokens[:, :-1], tokens[:, 1:])] * steps, {}),
        "resnet50": (cnn.to(ctx.device), [(images, labels)] * steps, {"channels_last": True}),
    }


def precision(ctx: Ctx) -> list[Row]:
    """Samples/s (second of two epochs) and peak memory through core (``compile=False``) in
    strict fp32, TF32, bf16 and fp16, on GPT-2 small (8 x 1024) and a ResNet-50-shaped CNN
    (64 x 224^2, channels_last)."""
    rows = []
    for name, (model, batches, extra) in _precision_jobs(ctx).items():
        rates: dict[str, float] = {}
        for label, (dtype, tf32) in PRECISIONS.items():
            figure = f"{name}: {label} samples/s"
            if not ctx.cuda and label in ("tf32", "fp16"):
                rows.append(skipped("precision", figure, "needs CUDA (TF32, fp16 autocast)"))
                continue
            run = core_run(ctx, copy.deepcopy(model), batches, amp_dtype=dtype, tf32=tf32, **extra)
            rates[label] = run.rate
            memory = "-" if run.peak is None else f"{run.peak / 2**30:.2f} GiB"
            note = f"peak memory {memory}, {len(batches)} steps per epoch, compile=False"
            rows.append(judged(ctx, "precision", figure, run.rate, note=note, digits=1))
        for base, goal in (("fp32 strict", 4.0), ("tf32", 1.6)):
            figure = f"{name}: bf16 / {base}"
            if base in rates and "bf16" in rates:
                ratio = rates["bf16"] / rates[base]
                rows.append(judged(ctx, "precision", figure, ratio, goal, unit="x"))
            else:
                rows.append(skipped("precision", figure, f"{base} not measured", f">= {goal}x"))
    return rows


def matmul_tflops(ctx: Ctx) -> float:
    """The sustained rate of a large bf16 matmul (8192^3 on CUDA, 50 in a row after 5 to warm
    up: ~0.1 s, long enough for the clocks to settle; 256^3 fp32 in a dry run)."""
    n, dtype = (256, torch.float32) if ctx.dry_run else (8192, torch.bfloat16)
    a = torch.randn(n, n, device=ctx.device, dtype=dtype)
    b = torch.randn(n, n, device=ctx.device, dtype=dtype)
    reps = 3 if ctx.dry_run else 50
    for _ in range(3 if ctx.dry_run else 5):
        a @ b
    seconds = compile_bench.timed(lambda: (a @ b, None)[1], reps, ctx.device)
    return 2 * n**3 * reps / seconds / 1e12


# A practitioner's batch for GPT-2 medium on an 80 GB H100: 16 x 1024 tokens in bf16 (an
# estimated 30-40 GB with the loss's fp32 logits); 32 would come near 80 GB and double every
# step's time. The rows report the peak memory core measured.
MFU_BATCH = 16


@dataclass(frozen=True)
class MfuJob:
    model: GPT
    batch: tuple[torch.Tensor, torch.Tensor]
    sizes: dict[str, int]
    batch_size: int

    @property
    def context(self) -> int:
        return self.sizes["ctx"]

    @property
    def params(self) -> int:
        """N: the parameters less the position embedding (nanoGPT's count)."""
        return sum(p.numel() for p in self.model.parameters()) - self.model.pos.weight.numel()

    def flops_per_token(self) -> float:
        """6N + 12 L H Q T: the model's training FLOPs per token (nanoGPT's estimate)."""
        layers, heads, d = self.sizes["layers"], self.sizes["heads"], self.sizes["d"]
        return 6 * self.params + 12 * layers * heads * (d // heads) * self.context

    def describe(self) -> str:
        return (
            f"{self.params / 1e6:.0f}M params (less position embedding), d {self.sizes['d']}, "
            f"{self.sizes['layers']} layers, batch {self.batch_size}x{self.context}"
        )


def _mfu_job(ctx: Ctx) -> MfuJob:
    """GPT-2 medium's shape (a miniature in a dry run), on the device, with one batch."""
    if ctx.dry_run:
        sizes, batch = dict(vocab=256, ctx=32, d=64, layers=2, heads=2), 2
    else:
        sizes, batch = dict(ctx=1024, d=1024, layers=24, heads=16), MFU_BATCH
    torch.manual_seed(0)
    model = GPT(**sizes).to(ctx.device)
    sizes = {**sizes, "vocab": model.tok.num_embeddings}
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(sizes["vocab"], (batch, sizes["ctx"] + 1), generator=g)
    tokens = tokens.to(ctx.device)
    return MfuJob(model, (tokens[:, :-1], tokens[:, 1:]), sizes, batch)


def _mfu_rows(
    ctx: Ctx, case: str, who: str, tokens_per_s: float, job: MfuJob, note: str
) -> list[Row]:
    achieved = tokens_per_s * job.flops_per_token() / 1e12
    peak = matmul_tflops(ctx)
    matmul = "256^3 fp32, dry run" if ctx.dry_run else "8192^3 bf16"
    return [
        judged(ctx, case, f"{who}: achieved model TFLOP/s", achieved, note=note, digits=1),
        judged(
            ctx,
            case,
            f"{who}: MFU = achieved / matmul",
            achieved / peak,
            0.45,
            note=f"matmul {peak:.1f} TFLOP/s measured ({matmul}), {tokens_per_s:,.0f} tokens/s",
        ),
    ]


def mfu(ctx: Ctx) -> list[Row]:
    """MFU of a hand-written step of the GPT-2-medium shape: the model compiled in place by
    ``core.transforms.compile_model`` (inductor), bf16 autocast, cross-entropy over the
    flattened tokens, fused AdamW; 2 steps to warm up after the compiling one, 8 timed."""
    job = _mfu_job(ctx)
    if ctx.cuda:
        torch.set_float32_matmul_precision("high")  # as core's tf32=True (restored after)
    records: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []

    def note_compile(event: str, /, **fields: Any) -> None:
        records.append(fields)

    def note_error(event: str, /, **fields: Any) -> None:
        errors.append(fields)

    backend = "eager" if ctx.dry_run else "inductor"
    compile_model(job.model, backend=backend, emit=note_compile, report_error=note_error)
    args = namespace(precision="bf16" if ctx.cuda else "fp32")
    step = compile_bench.trainer(job.model, job.batch, args)
    first_s = compile_bench.timed(step, 1, ctx.device)  # compiles
    compile_bench.timed(step, 1 if ctx.dry_run else 2, ctx.device)
    steps = 2 if ctx.dry_run else 8
    seconds = compile_bench.timed(step, steps, ctx.device)
    tokens_per_s = job.batch_size * job.context * steps / seconds
    breaks = records[0].get("graph_breaks", "-") if records else "-"
    note = (
        f"{job.describe()}, {args.precision}, compiled ({backend}): first step "
        f"{first_s:.1f} s, graph breaks {breaks}; {1000 * seconds / steps:.1f} ms per step"
    )
    if errors:
        note += f"; compile failed, ran eagerly: {errors[0].get('reason', errors[0])}"
    return _mfu_rows(ctx, "mfu", "hand step", tokens_per_s, job, note)


MFU_CORE_STEPS = 8  # per epoch; the second epoch's samples/s excludes the compilation


def mfu_core(ctx: Ctx) -> list[Row]:
    """MFU of the same job through core with ``compile=True`` (``compile=False`` in a CPU dry
    run, where inductor would compile C++ for minutes): bf16, the same loss, core's fused
    AdamW; two epochs of 8 steps, the second epoch's ``samples_per_s`` is the figure."""
    job = _mfu_job(ctx)
    steps = 2 if ctx.dry_run else MFU_CORE_STEPS
    run = core_run(
        ctx,
        job.model,
        [job.batch] * steps,
        epochs=2,
        amp_dtype="bf16" if ctx.cuda else "fp32",
        compile=ctx.cuda,
        loss_fn=compile_bench.cross_entropy,
    )
    tokens_per_s = run.rate * job.context
    compiled = "compile=True" if ctx.cuda else "compile=False (dry run)"
    if run.compiles:
        record = run.compiles[0]
        compiled += f": first step {record.get('seconds', 0):.1f} s, graph breaks "
        compiled += str(record.get("graph_breaks", "-"))
    note = (
        f"{job.describe()}, {compiled}; second epoch of {steps} steps, "
        f"{1000 * job.batch_size / run.rate:.1f} ms per step"
    )
    if run.peak is not None:
        note += f", peak memory {run.peak / 2**30:.1f} GiB"
    if run.compile_errors:
        note += f"; compile failed, ran eagerly: {run.compile_errors[0]}"
    return _mfu_rows(ctx, "mfu_core", "core", tokens_per_s, job, note)
