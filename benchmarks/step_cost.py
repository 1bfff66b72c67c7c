"""What `core` costs beyond a hand-written PyTorch loop, in two figures a noisy machine can
still resolve:

1. **Per optimizer step**: the CPU time of the thread that runs the steps, per step, for a
   tiny model (one torch thread, so the thread's CPU time holds all of the step's compute),
   against a hand-written loop doing the same steps. CPU time of one thread is what the
   step's Python work costs, whatever else the machine runs; the whole process's CPU time
   per step (event loop, log writer, monitor included) is printed beside it.
2. **Per ``train()`` call**: the fixed cost of a run of a 160M-parameter language model,
   measured as the time from asking for the run (building it included) to its first step
   plus the time from its last step to ``train()`` returning, against the same two spans
   of a hand-written loop (building the optimizer; nothing after). Core runs with its
   default settings except checkpoints (off: the hand loop saves nothing; a default
   epoch-end checkpoint of this model writes 1.9 GB) and the progress lines (off: they
   print the same either way, on the event loop).

Lightning Fabric and Hugging Face Accelerate run the same loop (``benchmarks.peers``) when
installed; "not installed" otherwise. Every job is alternated with the others in rounds,
the figures are medians over rounds.

    python -m benchmarks.step_cost                         # both parts
    python -m benchmarks.step_cost --part step --rounds 7  # only the per-step part
    python -m benchmarks.step_cost --part fixed --json out.json
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn

from benchmarks.models import GPT, mlp
from benchmarks.peers import PEERS, quiet
from core import create_optimized_training_optimizer
from core.loop.epoch import StepLoop

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Spans:
    """One job's figures: seconds before the first step, CPU seconds of the stepping thread
    over the steps, process CPU seconds over the steps, seconds after the last step."""

    before_s: float = 0.0
    step_thread_cpu_s: float = 0.0
    process_cpu_s: float = 0.0
    after_s: float = 0.0
    steps: int = 0
    marks: dict[str, float] = field(default_factory=dict)


@contextmanager
def _watching_core_steps(spans: Spans) -> Iterator[None]:
    """Time core's epochs from inside its step thread (the class is patched for the
    duration of one job; nothing in core is changed)."""
    original = StepLoop.run_epoch

    @functools.wraps(original)
    def run_epoch(self: StepLoop, *args: Any, **kwargs: Any) -> Any:
        spans.marks.setdefault("first_step", time.perf_counter())
        thread, process = time.thread_time(), time.process_time()
        step_before = self.global_step
        try:
            return original(self, *args, **kwargs)
        finally:
            spans.step_thread_cpu_s += time.thread_time() - thread
            spans.process_cpu_s += time.process_time() - process
            spans.steps += self.global_step - step_before
            spans.marks["last_step"] = time.perf_counter()

    StepLoop.run_epoch = run_epoch  # type: ignore[method-assign]
    try:
        yield
    finally:
        StepLoop.run_epoch = original  # type: ignore[method-assign]


def core_job(model: nn.Module, batches: Sequence[Batch], log_dir: Path, **settings: Any) -> Spans:
    spans = Spans()
    with _watching_core_steps(spans):
        asked = time.perf_counter()
        run = create_optimized_training_optimizer(
            model=model,
            train_loader=batches,
            max_epochs=1,
            learning_rate=1e-4,
            max_grad_norm=1.0,
            log_dir=log_dir,
            experiment_name="step_cost",
            checkpoint_every_n_epochs=None,
            progress=False,
            **settings,
        )
        anyio.run(run.train)
        returned = time.perf_counter()
    run.close()
    spans.before_s = spans.marks["first_step"] - asked
    spans.after_s = returned - spans.marks["last_step"]
    return spans


def _in_a_thread(body: Callable[[], Spans]) -> Spans:
    """Run ``body`` in a fresh thread, as core runs its steps in one."""
    out: list[Spans] = []
    thread = threading.Thread(target=lambda: out.append(body()))
    thread.start()
    thread.join()
    return out[0]


def _timed_loop(
    batches: Sequence[Batch],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    backward: Callable[[torch.Tensor], None],
    clip: Callable[[], None],
    spans: Spans,
) -> Spans:
    """The hand-written loop's steps (forward, loss, backward, clip, step, zero_grad), with
    the calling thread's and the process's CPU time over them."""
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    thread, process = time.thread_time(), time.process_time()
    for x, y in batches:
        backward(loss_fn(model(x), y))
        clip()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    spans.step_thread_cpu_s = time.thread_time() - thread
    spans.process_cpu_s = time.process_time() - process
    spans.steps = len(batches)
    return spans


def hand_job(model: nn.Module, batches: Sequence[Batch]) -> Spans:
    def body() -> Spans:
        spans, asked = Spans(), time.perf_counter()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        spans.before_s = time.perf_counter() - asked

        def clip() -> None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

        return _timed_loop(batches, model, optimizer, torch.Tensor.backward, clip, spans)

    return _in_a_thread(body)


def peer_job(name: str, model: nn.Module, batches: Sequence[Batch]) -> Spans:
    """The peer's own set-up (its object, ``setup``/``prepare``) counts as before the first
    step; its loop is timed like the hand-written one."""

    def body() -> Spans:
        spans, asked = Spans(), time.perf_counter()
        if name == "fabric":
            from lightning.fabric import Fabric

            fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
            wrapped, optimizer = fabric.setup(
                model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            )
            backward: Callable[[torch.Tensor], None] = fabric.backward

            def clip() -> None:
                fabric.clip_gradients(wrapped, optimizer, max_norm=1.0)
        else:
            from accelerate import Accelerator  # type: ignore[import-untyped, unused-ignore]

            accelerator = Accelerator(cpu=True, mixed_precision="no")
            wrapped, optimizer = accelerator.prepare(
                model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            )
            backward = accelerator.backward

            def clip() -> None:
                accelerator.clip_grad_norm_(wrapped.parameters(), 1.0)

        spans.before_s = time.perf_counter() - asked
        return _timed_loop(batches, wrapped, optimizer, backward, clip, spans)

    return _in_a_thread(body)


def _jobs(peers: Sequence[str]) -> list[str]:
    return ["hand", "core", *peers]


def _alternate(
    names: list[str], rounds: int, run: Callable[[str], Spans]
) -> dict[str, list[Spans]]:
    results: dict[str, list[Spans]] = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(run(name))
    return results


def per_step(args: argparse.Namespace, peers: Sequence[str], log_dir: Path) -> dict[str, Any]:
    """Step-thread and process CPU microseconds per optimizer step, tiny MLP, one thread."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = mlp(features=32, hidden=64, classes=10)
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(32, 32, generator=g), torch.randint(10, (32,), generator=g))
        for _ in range(args.steps)
    ]

    def run(name: str) -> Spans:
        replica = copy.deepcopy(model)
        if name == "hand":
            return hand_job(replica, batches)
        if name == "core":
            return core_job(replica, batches, log_dir, reports=False)
        return peer_job(name, replica, batches)

    for name in _jobs(peers):  # warm-up: allocator, lazy imports, first-call paths
        run(name)
    results = _alternate(_jobs(peers), args.rounds, run)

    def us(spans: list[Spans], attribute: str) -> float:
        return statistics.median(1e6 * getattr(s, attribute) / s.steps for s in spans)

    def extra_us(name: str, attribute: str) -> float:
        """The median over rounds of this job's time less the hand loop's in the same round:
        a pair run minutes apart on a VM drifts by more than what is measured here."""
        pairs = zip(results[name], results["hand"], strict=True)
        return statistics.median(
            1e6 * (getattr(job, attribute) / job.steps - getattr(hand, attribute) / hand.steps)
            for job, hand in pairs
        )

    out: dict[str, Any] = {
        "model": "MLP 32-64-64-10, batch 32, fp32, fused AdamW, clip 1.0, 1 torch thread",
        "steps_per_round": args.steps,
        "rounds": args.rounds,
        "hand_step_thread_us": round(us(results["hand"], "step_thread_cpu_s"), 1),
        "hand_process_us": round(us(results["hand"], "process_cpu_s"), 1),
    }
    for name in _jobs(peers)[1:]:
        out[f"{name}_step_thread_us"] = round(us(results[name], "step_thread_cpu_s"), 1)
        out[f"{name}_extra_step_thread_us"] = round(extra_us(name, "step_thread_cpu_s"), 1)
        out[f"{name}_process_us"] = round(us(results[name], "process_cpu_s"), 1)
        out[f"{name}_extra_process_us"] = round(extra_us(name, "process_cpu_s"), 1)
    return out


def fixed_cost(args: argparse.Namespace, peers: Sequence[str], log_dir: Path) -> dict[str, Any]:
    """Seconds before the first step and after the last one, 160M-parameter LM, 3 steps."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(vocab=50304, ctx=16, d=768, layers=17, heads=12)
    parameters = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(3):
        tokens = torch.randint(50304, (1, 17), generator=g)
        batches.append((tokens[:, :-1], tokens[:, 1:]))

    def run(name: str) -> Spans:
        replica = copy.deepcopy(model)
        if name == "hand":
            return hand_job(replica, batches)
        if name == "core":
            return core_job(replica, batches, log_dir)  # reports, monitor, hash: defaults
        return peer_job(name, replica, batches)

    for name in _jobs(peers):
        run(name)
    results = _alternate(_jobs(peers), args.rounds, run)

    def seconds(spans: list[Spans]) -> tuple[float, float]:
        return (
            statistics.median(s.before_s for s in spans),
            statistics.median(s.after_s for s in spans),
        )

    hand_before, hand_after = seconds(results["hand"])
    out: dict[str, Any] = {
        "model": f"GPT-shaped LM, {parameters / 1e6:.0f}M parameters, batch 1x16, fp32",
        "steps": len(batches),
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "hand_before_first_step_s": round(hand_before, 3),
        "hand_after_last_step_s": round(hand_after, 3),
    }
    for name in _jobs(peers)[1:]:
        before, after = seconds(results[name])
        out[f"{name}_before_first_step_s"] = round(before, 3)
        out[f"{name}_after_last_step_s"] = round(after, 3)
        out[f"{name}_extra_per_train_s"] = round(before + after - hand_before - hand_after, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["step", "fixed", "both"], default="both")
    parser.add_argument("--steps", type=int, default=400, help="steps per round (per-step part)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (fixed part)")
    parser.add_argument(
        "--peers",
        nargs="*",
        choices=list(PEERS),
        default=None,
        help="peers to run beside core (default: every installed one)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    args.threads = args.threads or torch.get_num_threads()
    wanted = list(PEERS) if args.peers is None else args.peers
    peers = [name for name in wanted if PEERS[name].installed]
    if peers:
        quiet()
    figures: dict[str, Any] = {
        "torch": torch.__version__,
        "peers_not_installed": [n for n in wanted if n not in peers],
    }
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("step", "both"):
            figures["per_step"] = per_step(args, peers, Path(tmp))
        if args.part in ("fixed", "both"):
            figures["per_train"] = fixed_cost(args, peers, Path(tmp))
    for section, values in figures.items():
        if isinstance(values, dict):
            print(f"[{section}]")
            for key, value in values.items():
                print(f"  {key:>32}: {value}")
        else:
            print(f"{section}: {values}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
