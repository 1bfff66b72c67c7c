"""The batch-size search on CPU memory budgets: the size it finds, the trials it takes, and
the true maximum found by a finer sweep around that size (measured, not assumed).

Each case is a model, a real batch (tiled to any size) and a budget. The search is
``core.memory.find_batch_size``; every trial is one full training step (forward,
cross-entropy loss, backward, AdamW step) measured by the CPU memory meter. The sweep then
measures the sizes ``found + k * step`` (k = -2..2, ``step`` about 1% of the size found) and
``found - 1 .. found + 1`` (reusing the search's own measurements, which are deterministic);
the true maximum is the largest swept size that fits with every larger swept size failing
("not monotone" is flagged when a smaller one does not fit).

The default budgets, 0.25 and 1 GiB, put the answers in the thousands to tens of thousands
of samples; on a 2-core CPU a 4 GiB budget takes minutes per case (each trial is a full step).

    python -m benchmarks.batch_size_finder                       # both models, 0.25 and 1 GiB
    python -m benchmarks.batch_size_finder --budgets 1 4 --models email
    python -m benchmarks.batch_size_finder --dry-run             # tiny models and budgets
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.models import mlp
from core.memory import batch_maker_from, find_batch_size, meter_for, run_trial
from examples.email_sequence import EmailSequenceDataset, EmailSequenceModel


@dataclass
class Case:
    name: str
    model: nn.Module
    batch: tuple[torch.Tensor, torch.Tensor]


def cases(dry_run: bool, models: list[str]) -> list[Case]:
    torch.manual_seed(0)
    data = EmailSequenceDataset(256, seed=0)  # inputs [256, max_emails=8, subject_len + 2 = 8]
    email = EmailSequenceModel(d_model=32, n_layers=1) if dry_run else EmailSequenceModel()
    features, hidden = (64, 128) if dry_run else (256, 512)
    inputs, labels = torch.randn(256, features), data.labels
    net = mlp(features, hidden)
    chosen = {
        "email": Case("email transformer", email, (data.inputs, labels)),
        "mlp": Case(f"MLP {features}-{hidden}-{hidden}-10", net, (inputs, labels)),
    }
    return [chosen[name] for name in models]


def sweep(
    fits: Callable[[int], bool], found: int, limit: int, known: dict[int, bool]
) -> tuple[int | None, bool, int]:
    """(true maximum, monotone, number of sizes looked at) around ``found``."""
    step = max(1, round(found / 100))
    sizes = {found + k * step for k in range(-2, 3)} | {found - 1, found + 1}
    outcome = {
        n: known[n] if n in known else fits(n) for n in sorted(n for n in sizes if 1 <= n <= limit)
    }
    fitting = [n for n, ok in outcome.items() if ok]
    best = next(
        (n for n in reversed(fitting) if not any(outcome[m] for m in outcome if m > n)), None
    )
    monotone = best is not None and all(outcome[m] for m in outcome if m <= best)
    return best, monotone, len(outcome)


def run_case(case: Case, budget_gb: float, limit: int) -> dict[str, Any]:
    loss_fn = nn.CrossEntropyLoss()
    make = batch_maker_from(case.batch)
    start = time.perf_counter()
    search = find_batch_size(
        case.model, None, budget_gb, limit, make_batch=make, loss_fn=loss_fn
    )  # the search starts at 1 sample (no input_shape)
    seconds = time.perf_counter() - start
    meter = meter_for(next(case.model.parameters()).device)  # cpu here; cuda in the gpu suite

    def fits(n: int) -> bool:
        trial = run_trial(
            case.model, make, n, loss_fn=loss_fn, meter=meter, target_bytes=search.target_bytes
        )
        return trial.fits

    known = {t.batch_size: t.fits for t in search.trials}
    true_max, monotone, swept = sweep(fits, search.batch_size, limit, known)
    return {
        "model": case.name,
        "params_m": sum(p.numel() for p in case.model.parameters()) / 1e6,
        "budget_gib": budget_gb,
        "found": search.batch_size,
        "trials": len(search.trials),
        "search_s": round(seconds, 1),
        "true_max": true_max,
        "monotone": monotone,
        "swept": swept,
        "sizes_tried": [t.batch_size for t in search.trials],
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| model | params (M) | budget (GiB) | found | trials | search (s) | true max "
        "(sweep) | found = true max |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|:---:|")
    for r in rows:
        exact = "yes" if r["found"] == r["true_max"] else "no"
        shape = "" if r["monotone"] else ", not monotone"
        true_max = f"{r['true_max']} ({r['swept']} sizes{shape})"
        print(
            f"| {r['model']} | {r['params_m']:.2f} | {r['budget_gib']:g} | {r['found']} | "
            f"{r['trials']} | {r['search_s']} | {true_max} | {exact} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=None, help="GiB")
    parser.add_argument("--models", nargs="+", choices=["email", "mlp"], default=["email", "mlp"])
    parser.add_argument("--max-batch-size", type=int, default=1 << 18)
    parser.add_argument("--dry-run", action="store_true", help="tiny models and budgets")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    budgets = args.budgets or ([0.02, 0.05] if args.dry_run else [0.25, 1.0])
    rows = []
    for case in cases(args.dry_run, args.models):
        for budget in budgets:
            rows.append(run_case(case, budget, args.max_batch_size))
            print(f"done: {case.name} @ {budget:g} GiB", file=sys.stderr, flush=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, fp32, AdamW")
    print_table(rows)
    for r in rows:
        print(f"{r['model']} @ {r['budget_gib']:g} GiB: sizes tried {r['sizes_tried']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
