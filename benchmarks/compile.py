"""Training steps per second, eager against ``torch.compile`` (``core.transforms.compile_model``,
in place), for the email-sequence transformer and a GPT.

Each model is copied (same initial weights); the compiled copy's first step compiles it
(that time, and the graph breaks, are reported apart); then both take ``--warmup`` steps and
are timed over ``--rounds`` alternating rounds of ``--steps`` training steps (forward,
cross-entropy over the flattened tokens, backward, fused AdamW; only the model is compiled,
as ``compile=True`` does in core). Prints the median steps/s of each and their ratio.

    python -m benchmarks.compile                     # CPU, small sizes
    python -m benchmarks.compile --dry-run           # plumbing check: tiny sizes, 2 steps
    python -m benchmarks.compile --device cuda       # GPT-2 small shape (skips without CUDA)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.models import GPT
from core.transforms import compile_model
from examples.email_sequence.model import EmailSequenceModel

Batch = tuple[torch.Tensor, torch.Tensor]


def email_job(args: argparse.Namespace, device: torch.device) -> tuple[nn.Module, Batch]:
    sizes = {"d_model": 16, "n_layers": 1} if args.dry_run else {}
    model = EmailSequenceModel(dropout=0.0, **sizes)  # dropout off: same work in both
    b, length, s = args.batch_size or 256, model.max_emails, model.subject_len
    g = torch.Generator().manual_seed(0)
    inputs = torch.cat(
        [
            torch.randint(1, model.vocab_size, (b, length, s), generator=g),
            torch.randint(0, 24, (b, length, 1), generator=g),
            torch.randint(0, 31, (b, length, 1), generator=g),
        ],
        dim=-1,
    )
    targets = torch.randint(0, 2, (b,), generator=g)
    return model.to(device), (inputs.to(device), targets.to(device))


def gpt_job(args: argparse.Namespace, device: torch.device) -> tuple[nn.Module, Batch]:
    if args.dry_run:
        sizes: dict[str, int] = {"vocab": 256, "ctx": 16, "d": 32, "layers": 1, "heads": 2}
    elif device.type == "cuda":
        sizes = {"ctx": 1024}  # GPT-2 small: 124M parameters, 12 layers, d=768
    else:
        sizes = {"vocab": 4096, "ctx": 128, "d": 128, "layers": 4, "heads": 4}
    model = GPT(**sizes)
    b = args.batch_size or (8 if device.type == "cuda" else 16)
    vocab, ctx = model.tok.num_embeddings, model.pos.num_embeddings
    tokens = torch.randint(vocab, (b, ctx + 1), generator=torch.Generator().manual_seed(0))
    return model.to(device), (tokens[:, :-1].to(device), tokens[:, 1:].to(device))


JOBS: dict[str, Callable[[argparse.Namespace, torch.device], tuple[nn.Module, Batch]]] = {
    "email_sequence": email_job,
    "gpt": gpt_job,
}


def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with the classes on the last axis. The GPT's ``[B, vocab, T]`` logits
    are a transposed view of ``[B, T, vocab]``: flattening them back to ``[B*T, vocab]``
    costs no copy and keeps the softmax on the contiguous axis, as nanoGPT's loss does.

    >>> cross_entropy(torch.zeros(2, 4, 3), torch.zeros(2, 3, dtype=torch.long)).shape
    torch.Size([])
    """
    if outputs.dim() == 3:
        return F.cross_entropy(outputs.transpose(1, 2).flatten(0, 1), targets.flatten())
    return F.cross_entropy(outputs, targets)


def trainer(model: nn.Module, batch: Batch, args: argparse.Namespace) -> Callable[[], None]:
    """One training step: forward and loss under autocast (bf16) or none, backward, fused
    AdamW (core's default optimizer, so the MFU rows compare like with like)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ctx: Any = nullcontext()
    if args.precision == "bf16":
        ctx = torch.autocast(batch[0].device.type, dtype=torch.bfloat16)

    def step() -> None:
        inputs, targets = batch
        with ctx:
            loss = cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def timed(fn: Callable[[], None], steps: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()  # timing boundary
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()  # timing boundary
    return time.perf_counter() - start


def measure(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    torch.manual_seed(0)
    model, batch = JOBS[name](args, device)
    compiled = copy.deepcopy(model)
    records: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    compile_model(
        compiled,
        mode=args.mode,
        backend=getattr(args, "backend", "inductor"),  # the suite's dry run passes "eager"
        emit=lambda event, **fields: records.append(fields),
        report_error=lambda event, **fields: errors.append(fields),
    )
    eager_step, compiled_step = trainer(model, batch, args), trainer(compiled, batch, args)
    first_step_s = timed(compiled_step, 1, device)  # compiles
    for fn in (eager_step, compiled_step):
        timed(fn, args.warmup, device)
    rates: dict[str, list[float]] = {"eager": [], "compiled": []}
    for round_ in range(args.rounds):
        order = [("eager", eager_step), ("compiled", compiled_step)]
        for label, fn in order if round_ % 2 == 0 else order[::-1]:
            rates[label].append(args.steps / timed(fn, args.steps, device))
    eager, fast = statistics.median(rates["eager"]), statistics.median(rates["compiled"])
    record = records[0] if records else {}
    return {
        "model": name,
        "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
        "batch": len(batch[1]),
        "eager": eager,
        "compiled": fast,
        "ratio": fast / eager,
        "compile_s": record.get("seconds", float("nan")),
        "first_step_s": first_step_s,
        "graph_breaks": record.get("graph_breaks", "-"),
        "failed": errors[0]["reason"] if errors else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", nargs="+", choices=list(JOBS), default=list(JOBS))
    parser.add_argument("--mode", default="default", help="torch.compile mode")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--batch-size", type=int, default=0, help="0: the model's default")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, 2 steps")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("skipped: --device cuda, but CUDA is not available")
        return
    if args.dry_run:
        args.steps, args.warmup, args.rounds = 2, 1, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = [measure(name, args, device) for name in args.models]
    label = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    threads = torch.get_num_threads()
    print(f"\ntorch {torch.__version__}, {label}, {threads} threads, {args.precision}, "
          f"mode={args.mode}, {args.rounds}x{args.steps} timed steps\n")  # fmt: skip
    print("| model | params (M) | batch | eager steps/s | compiled steps/s | compiled/eager "
          "| compile s (first call) | first step s | graph breaks |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['params_M']:.2f} | {r['batch']} | {r['eager']:.2f} | "
              f"{r['compiled']:.2f} | {r['ratio']:.2f} | {r['compile_s']:.1f} | "
              f"{r['first_step_s']:.1f} | {r['graph_breaks']} |")  # fmt: skip
        if r["failed"]:
            print(f"\n{r['model']}: compile failed, ran eagerly ({r['failed']})", file=sys.stderr)


if __name__ == "__main__":
    main()
