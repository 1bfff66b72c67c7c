"""What ``import core`` costs beyond building a torch optimizer, in fresh interpreters.

    python -m benchmarks.import_cost                       # this checkout, 9 processes
    python -m benchmarks.import_cost --runs 11 --against ../before   # and another checkout

Each process imports torch and builds ``torch.optim.AdamW`` (which loads torch's compiler
stack), then times ``import core`` alone: wall seconds (``time.perf_counter``) and the
process's CPU seconds (``time.process_time``: on a machine others use, the steadier figure),
and counts the modules it added, ``core``'s own and all. With ``--against`` the checkouts
take turns (A B A B ...), so that a drift in the machine's speed reaches both. Each row
gives the median, min and max over ``--runs``.

Where a checkout has no ``__pycache__`` yet, its first process compiles it: run twice.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys, time, torch
torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
before = set(sys.modules)
wall, cpu = time.perf_counter(), time.process_time()
import core
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
added = set(sys.modules) - before
print(json.dumps([wall, cpu, sum(name.split(".")[0] == "core" for name in added), len(added)]))
"""


def one_import(checkout: Path) -> list[float]:
    """One fresh interpreter's figures: wall s, CPU s, core's modules added, all added."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=checkout,  # the first entry of sys.path: this checkout's core is the one imported
        capture_output=True,
        text=True,
        check=True,
    )
    figures: list[float] = json.loads(done.stdout)
    return figures


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--against", type=Path, action="append", default=[])
    args = parser.parse_args()
    checkouts = [ROOT, *(path.resolve() for path in args.against)]
    rows: dict[Path, list[list[float]]] = {checkout: [] for checkout in checkouts}
    for _ in range(args.runs):
        for checkout in checkouts:
            rows[checkout].append(one_import(checkout))
    print("checkout | wall s: median (min-max) | CPU s: median (min-max) | modules: core, all")
    for checkout, runs in rows.items():
        wall = spread([run[0] for run in runs])
        cpu = spread([run[1] for run in runs])
        print(f"{checkout} | {wall} | {cpu} | {runs[0][2]:.0f}, {runs[0][3]:.0f}")


if __name__ == "__main__":
    main()
