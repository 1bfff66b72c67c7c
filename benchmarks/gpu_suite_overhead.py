"""The GPU suite's overhead cases: core against the hand-written loop of
``benchmarks.overhead``, with Lightning Fabric and Hugging Face Accelerate running that same
loop beside them, and the check that core's step loop makes no host sync.

Every runner does the same job in each round, start-up included: one ``train()`` call of
core (``compile=False``, like the eager loops; GPU monitor on, as a user gets it; checkpoints,
progress and reports off), one call of the hand-written loop, and the loop through
``fabric.setup`` / ``accelerator.prepare``, each building its framework object inside the
round. Same initial weights, batches, fused AdamW, precision, clipping and accumulation.
The order is reversed every other round; the figure is the ratio of median seconds.
"""

from __future__ import annotations

import copy
import gc
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from benchmarks import overhead
from benchmarks.gpu_suite_rows import (
    CaseTimeout,
    Ctx,
    Row,
    core_run,
    judged,
    namespace,
    rounds,
    skipped,
)
from benchmarks.peers import PEERS, Peer, quiet
from core import GradientAccumulationConfig

__all__ = ("JOBS", "overhead_gpt2", "overhead_mlp", "sync_check", "sync_errors")


@dataclass(frozen=True)
class Job:
    """One overhead job: its sizes on a GPU, the goal for core / hand, the rounds wanted,
    and the goal for core / the fastest peer (None: measured only)."""

    sizes: dict[str, Any]
    goal: float
    rounds: int
    peer_goal: float | None = None
    why: str = ""


JOBS = {
    # 100 optimizer steps of 8 x 1024 tokens: up to ~12 s per train() on an H100, so 4
    # runners x 2 rounds (3 where they fit) take the case's budget; 16 x 1024 would not fit.
    "gpt2": Job(
        dict(precision="bf16", batch_size=8, seq_len=1024, accum=1, steps=100),
        goal=0.99,
        rounds=3,
        peer_goal=1.0,
        why="batch 8 x 1024: 16 x 1024 would double every run, past the suite's budget",
    ),
    "mlp": Job(
        dict(precision="fp32", batch_size=64, seq_len=0, accum=2, steps=300), goal=0.97, rounds=5
    ),
}
DRY_SIZES = dict(precision="fp32", batch_size=4, seq_len=16, steps=2)


def overhead_gpt2(ctx: Ctx) -> list[Row]:
    """core, Fabric and Accelerate / the hand-written loop on GPT-2 small in bf16."""
    return _compare(ctx, "gpt2")


def overhead_mlp(ctx: Ctx) -> list[Row]:
    """core, Fabric and Accelerate / the hand-written loop on the small MLP (fp32, TF32 on)."""
    return _compare(ctx, "mlp")


def _compare(ctx: Ctx, name: str) -> list[Row]:
    job = JOBS[name]
    case = f"overhead_{name}"
    sizes = {**job.sizes, **DRY_SIZES} if ctx.dry_run else job.sizes
    args = namespace(
        model=name,
        epochs=1,
        checkpoint_every_n_epochs=None,
        no_monitor=False,
        user_surface=False,
        **sizes,
    )
    if ctx.cuda:  # TF32 for every runner's fp32 matmuls (core's default; restored after)
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    model, batches = overhead.make_job(args, ctx.device)
    runners: dict[str, Callable[[nn.Module, list[Any]], None]] = {
        "hand": lambda m, b: overhead.hand_loop(m, b, args, ctx.device),
        "core": lambda m, b: overhead.ours(m, b, args, ctx.tmp, tf32=True),
    }
    peer_rows: dict[str, Row] = {}
    if any(peer.installed for peer in PEERS.values()):
        quiet()
    warm_up = batches[: 2 * args.accum]  # imports, allocator, kernels, cuBLAS handles
    for warm in runners.values():
        warm(copy.deepcopy(model), warm_up)
    for peer in PEERS.values():
        run = partial(_peer, peer, args=args, device=ctx.device)
        failure = _warm(case, name, peer, run, copy.deepcopy(model), warm_up)
        if failure is None:
            runners[peer.name] = run
        else:
            peer_rows[peer.name] = failure
    seconds: dict[str, list[float]] = {runner: [] for runner in runners}
    order = list(runners)
    for number in rounds(ctx, job.rounds):
        for runner in order[:: 1 if number % 2 == 0 else -1]:  # a copy: a peer may drop out
            if runner not in seconds:
                continue  # a peer that failed earlier in this round
            replica = copy.deepcopy(model)
            gc.collect()  # the last runner's garbage is not this runner's cost
            run_once = partial(runners[runner], replica, batches)
            try:
                seconds[runner].append(overhead.timed(run_once, ctx.device))
            except CaseTimeout:
                raise
            except Exception as error:
                if runner in ("hand", "core"):
                    raise
                peer_rows[runner] = _failed(case, name, runner, error)
                del seconds[runner]
                order.remove(runner)
            del replica
    return _rows(ctx, name, job, args, seconds, peer_rows)


def _failed(case: str, name: str, runner: str, error: Exception) -> Row:
    """A peer's error row: its failure does not cost core's and the other peer's rows."""
    reason = f"error: {type(error).__name__}: {error}".replace("\n", " ")
    return Row(case, f"{name}: {PEERS[runner].label} / hand-written", "-", "-", reason[:400])


def _peer(
    peer: Peer, model: nn.Module, batches: list[Any], *, args: Any, device: torch.device
) -> None:
    overhead.peer_run(peer, model, batches, args, device)


def _warm(
    case: str,
    name: str,
    peer: Peer,
    run: Callable[[nn.Module, list[Any]], None],
    model: nn.Module,
    batches: list[Any],
) -> Row | None:
    """None when ``peer`` ran its warm-up; else its row, saying why it cannot take part (a
    peer failing is its own error row: core's and the other peer's rows still come)."""
    figure = f"{name}: {peer.label} / hand-written"
    if not peer.installed:
        return skipped(case, figure, f"not installed (no {peer.module!r} package)")
    try:
        run(model, batches)
    except ImportError as error:  # installed only in part, or a dependency of it missing
        return skipped(case, figure, f"not importable: {error}"[:300])
    except CaseTimeout:
        raise
    except Exception as error:
        return _failed(case, name, peer.name, error)
    return None


def _rows(
    ctx: Ctx,
    name: str,
    job: Job,
    args: Any,
    seconds: dict[str, list[float]],
    peer_rows: dict[str, Row],
) -> list[Row]:
    case = f"overhead_{name}"
    median = {runner: statistics.median(times) for runner, times in seconds.items()}
    done = len(seconds["hand"])
    shape = f"{args.batch_size}x{args.seq_len}" if name == "gpt2" else str(args.batch_size)
    precision = args.precision + (" (TF32 matmuls, every runner)" if name == "mlp" else "")
    common = (
        f"{precision}, batch {shape}, accumulation {args.accum}, {args.steps} optimizer steps "
        f"per train(), start-up included, median of {done} round(s), order reversed every "
        f"other round; hand {median['hand']:.2f} s"
    )
    if job.why and not ctx.dry_run:
        common += f"; {job.why}"
    rows = [
        judged(
            ctx,
            case,
            f"{name}: core / hand-written",
            median["hand"] / median["core"],
            job.goal,
            note=f"core {median['core']:.2f} s (compile=False, GPU monitor on); {common}",
            digits=4,
        )
    ]
    measured = []
    for peer in PEERS.values():
        figure = f"{name}: {peer.label} / hand-written"
        if peer.name in peer_rows:
            rows.append(peer_rows[peer.name])
            continue
        measured.append(peer)
        note = f"{peer.label} {median[peer.name]:.2f} s; hand {median['hand']:.2f} s"
        rows.append(judged(ctx, case, figure, median["hand"] / median[peer.name], note=note))
    figure = f"{name}: core / fastest peer"
    if not measured:
        rows.append(skipped(case, figure, "no peer installed (lightning, accelerate)"))
        return rows
    fastest = min(measured, key=lambda peer: median[peer.name])
    rows.append(
        judged(
            ctx,
            case,
            figure,
            median[fastest.name] / median["core"],
            job.peer_goal,
            note=f"fastest peer: {fastest.label}",
            digits=4,
        )
    )
    return rows


# -- no host sync inside the step loop ----------------------------------------------------


SYNC_JOBS = {
    "gpt2": dict(precision="bf16", batch_size=8, seq_len=1024, accum=1, steps=10),
    "mlp": dict(precision="fp32", batch_size=64, seq_len=0, accum=2, steps=30),
}


@contextmanager
def sync_errors(cuda: bool) -> Iterator[list[int]]:
    """Every optimizer step of core after the first runs under
    ``torch.cuda.set_sync_debug_mode("error")`` (``.item()``, ``.cpu()``, a blocking copy
    or ``torch.cuda.synchronize()`` inside it raises); yields the checked steps' numbers.
    The first step is left out: the optimizer creates its state there. Off CUDA the steps
    are only counted (the plumbing of a dry run)."""
    from core.loop.step import OptimizerStep  # the step

    checked: list[int] = []
    calls = [0]
    original = OptimizerStep.__call__

    def guarded(self: Any, window: Any, **kwargs: Any) -> None:
        calls[0] += 1
        checking = cuda and calls[0] > 1
        if checking:
            torch.cuda.set_sync_debug_mode("error")
        try:
            original(self, window, **kwargs)
        finally:
            if checking:
                torch.cuda.set_sync_debug_mode("default")
        if calls[0] > 1:
            checked.append(kwargs.get("step", calls[0]))

    OptimizerStep.__call__ = guarded  # type: ignore[method-assign]
    try:
        yield checked
    finally:
        OptimizerStep.__call__ = original  # type: ignore[method-assign]


def _causes(error: BaseException) -> str:
    parts: list[str] = []
    current: BaseException | None = error
    while current is not None and len(parts) < 10:
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " | ".join(parts)


def sync_check(ctx: Ctx) -> list[Row]:
    """Core's GPT-2 (bf16) and MLP (fp32, accumulation 2) runs with every step after the
    first under ``set_sync_debug_mode("error")``: pass when no step made a host sync."""
    rows = []
    for name, full in SYNC_JOBS.items():
        sizes = {**full, **DRY_SIZES} if ctx.dry_run else full
        args = namespace(model=name, epochs=1, **sizes)
        model, batches = overhead.make_job(args, ctx.device)
        figure = f"{name}: steps with a host sync"
        settings = dict(
            amp_dtype=overhead.DTYPES[args.precision],
            gradient_accumulation_config=GradientAccumulationConfig(accumulation_steps=args.accum),
            max_grad_norm=1.0,
        )
        failure = ""
        with sync_errors(ctx.cuda) as checked:
            try:
                core_run(ctx, model, batches, epochs=1, **settings)
            except Exception as error:
                text = _causes(error)
                if "synchroniz" not in text:
                    raise
                failure = text
        shape = f"{args.batch_size}x{args.seq_len}" if name == "gpt2" else str(args.batch_size)
        mode = "under set_sync_debug_mode('error')" if ctx.cuda else "(counted only: no CUDA)"
        note = (
            f"{len(checked)} of {args.steps} steps checked {mode}, step 1 left out "
            f"(it creates the optimizer state); {args.precision}, batch {shape}, "
            f"accumulation {args.accum}, clipping on, compile=False"
        )
        if failure:
            rows.append(Row("sync_check", figure, ">= 1", "0", "fail", f"{failure[:400]}; {note}"))
        elif not checked:
            reason = "no step was checked: core.loop.step.OptimizerStep was not called"
            rows.append(Row("sync_check", figure, "-", "0", f"error: {reason}", note))
        else:
            status = "dry-run" if ctx.dry_run else "pass"
            rows.append(Row("sync_check", figure, "0", "0", status, note))
    return rows
