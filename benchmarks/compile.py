"""Training steps per second, eager against ``torch.compile`` (``core.transforms.compile_model``,
in place), for the email-sequence transformer and a GPT.

Each model is copied (same initial weights); the compiled copy's first step compiles it
(that time, and the graph breaks, are reported apart); then both take ``--warmup`` steps and
are timed over ``--rounds`` alternating rounds of ``--steps`` training steps (forward,
cross-entropy over the flattened tokens, backward, fused AdamW). Prints the median steps/s of
each and their ratio.

``--scope`` is what is compiled: ``model`` (the module, in place, as ``compile=True`` does in
core), ``loss`` (one function of the model and its cross-entropy, so the loss fuses with the
last layer), or ``step`` (forward and backward in one compiled function, the backward
captured by compiled autograd). ``--scope all`` measures the three against one eager copy.

    python -m benchmarks.compile                     # CPU, small sizes
    python -m benchmarks.compile --dry-run           # plumbing check: tiny sizes, 2 steps
    python -m benchmarks.compile --device cuda       # GPT-2 small shape (skips without CUDA)
    python -m benchmarks.compile --device cuda --models gpt --precision bf16 --scope all
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


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def trainer(
    model: nn.Module, batch: Batch, args: argparse.Namespace, scope: str = "model"
) -> Callable[[], None]:
    """One training step: forward and loss under autocast (bf16) or none, backward, fused
    AdamW (core's default optimizer, so the MFU rows compare like with like). ``scope``
    ``loss`` compiles the model with its loss, ``step`` forward and backward together; the
    optimizer step stays eager (its fused kernel is one launch already)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ctx: Any = nullcontext()
    if args.precision == "bf16":
        ctx = torch.autocast(batch[0].device.type, dtype=torch.bfloat16)

    def model_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with ctx:
            return cross_entropy(model(inputs), targets)

    def forward_backward(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        model_loss(inputs, targets).backward()

    backend = getattr(args, "backend", "inductor")
    if scope == "step":
        compiled = torch.compile(forward_backward, mode=args.mode, backend=backend)

        def run(inputs: torch.Tensor, targets: torch.Tensor) -> None:
            with torch._dynamo.config.patch(compiled_autograd=True):  # backward in the graph
                compiled(inputs, targets)
    else:
        loss: Loss = (
            torch.compile(model_loss, mode=args.mode, backend=backend)
            if scope == "loss"
            else model_loss
        )

        def run(inputs: torch.Tensor, targets: torch.Tensor) -> None:
            loss(inputs, targets).backward()

    def step() -> None:
        run(*batch)
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


def _into(records: list[dict[str, Any]]) -> Callable[..., None]:
    """An ``emit`` that keeps each record's fields in ``records``."""
    return lambda event, **fields: records.append(fields)


def measure(name: str, args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """Eager against each scope asked for, on copies of one model (same initial weights)."""
    torch.manual_seed(0)
    model, batch = JOBS[name](args, device)
    scopes = ["model", "loss", "step"] if args.scope == "all" else [args.scope]
    steps: dict[str, Callable[[], None]] = {"eager": trainer(model, batch, args)}
    notes: dict[str, dict[str, Any]] = {}
    for scope in scopes:
        copied = copy.deepcopy(model)
        records: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        if scope == "model":
            compile_model(
                copied,
                mode=args.mode,
                backend=getattr(args, "backend", "inductor"),  # the suite's dry run: "eager"
                emit=_into(records),
                report_error=_into(errors),
            )
        steps[scope] = trainer(copied, batch, args, scope)
        first_step_s = timed(steps[scope], 1, device)  # compiles
        record = records[0] if records else {}
        notes[scope] = {
            "compile_s": record.get("seconds", float("nan")),
            "first_step_s": first_step_s,
            "graph_breaks": record.get("graph_breaks", "-"),
            "failed": errors[0]["reason"] if errors else "",
        }
    for fn in steps.values():
        timed(fn, args.warmup, device)
    rates: dict[str, list[float]] = {label: [] for label in steps}
    order = list(steps.items())
    for round_ in range(args.rounds):
        for label, fn in order if round_ % 2 == 0 else order[::-1]:
            rates[label].append(args.steps / timed(fn, args.steps, device))
    eager = statistics.median(rates["eager"])
    return [
        {
            "model": name,
            "scope": scope,
            "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
            "batch": len(batch[1]),
            "eager": eager,
            "compiled": statistics.median(rates[scope]),
            "ratio": statistics.median(rates[scope]) / eager,
            **notes[scope],
        }
        for scope in scopes
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", nargs="+", choices=list(JOBS), default=list(JOBS))
    parser.add_argument("--mode", default="default", help="torch.compile mode")
    parser.add_argument(
        "--scope",
        choices=["model", "loss", "step", "all"],
        default="model",
        help="what is compiled: the model, the model with its loss, or forward and backward",
    )
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
    rows = [row for name in args.models for row in measure(name, args, device)]
    label = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    threads = torch.get_num_threads()
    print(
        f"\ntorch {torch.__version__}, {label}, {threads} threads, {args.precision}, "
        f"mode={args.mode}, {args.rounds}x{args.steps} timed steps\n"
    )
    print(
        "| model | compiled | params (M) | batch | eager steps/s | compiled steps/s | "
        "compiled/eager | compile s (first call) | first step s | graph breaks |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['scope']} | {r['params_M']:.2f} | {r['batch']} | "
            f"{r['eager']:.2f} | "
            f"{r['compiled']:.2f} | {r['ratio']:.2f} | {r['compile_s']:.1f} | "
            f"{r['first_step_s']:.1f} | {r['graph_breaks']} |"
        )
        if r["failed"]:
            print(f"\n{r['model']}: compile failed, ran eagerly ({r['failed']})", file=sys.stderr)


if __name__ == "__main__":
    main()
