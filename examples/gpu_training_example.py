"""Seed 003's GPU training example: a small CNN on scikit-learn's 8x8 digits (or, for expert
parallelism, the mixture-of-experts example), trained by ``core-train`` with the seed's
switches, its results written to ``results/gpu_training/``.

    python examples/gpu_training_example.py                      # auto: GPU where there is one
    python examples/gpu_training_example.py --gpu-mode cpu
    python examples/gpu_training_example.py --mixed-precision --precision-type bf16
    python examples/gpu_training_example.py --batch-size 64 --accumulation-steps 4
    python examples/gpu_training_example.py --compile --compile-mode default --monitor-gpu
    torchrun --standalone --nproc_per_node=2 examples/gpu_training_example.py --gpu-mode multi_gpu
    python examples/gpu_training_example.py --parallel-strategy expert_parallel --experts 8
    torchrun --standalone --nproc_per_node=2 examples/gpu_training_example.py \\
        --gpu-mode multi_gpu --parallel-strategy expert_parallel

Every flag of ``core-train --help`` works here. The digits run's defaults come from
``examples/digits/config.toml`` (8 epochs, lr 3e-3, seed 0), with ``--scheduler onecycle`` and
``--batch-size 32``. With ``--parallel-strategy expert_parallel`` or ``--experts N`` it trains
the MoE example instead (``examples/moe``: a transformer whose feed-forward blocks are MoE
layers, on sequences from four domains; defaults from ``examples/moe/config.toml``, 5 epochs,
``--batch-size 32``): under torchrun each rank holds its share of the experts, in one process
their placement over this machine's devices is planned. Written to ``--results-dir``
(default ``results/gpu_training``): ``training_metrics.png`` (loss, accuracy, epoch time...),
``performance_summary.txt`` (throughput, AMP, compile status, memory) and ``results.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from core.cli import FitOutcome, run_fit

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "digits" / "config.toml"
DEFAULTS = ["--scheduler", "onecycle", "--batch-size", "32"]  # later flags override these
MOE_CONFIG = ROOT / "examples" / "moe" / "config.toml"
MOE_DEFAULTS = ["--batch-size", "32"]
MOE_FLAGS = ("--experts", "--parallel-strategy=expert_parallel")
REPORTS = ("training_metrics.png", "performance_summary.txt")


def split_args(argv: list[str]) -> tuple[Path, list[str]]:
    """``(results directory, the arguments for core-train)``."""
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    own.add_argument("--results-dir", type=Path, default=Path("results/gpu_training"))
    known, rest = own.parse_known_args(argv)
    return known.results_dir, rest


def wants_moe(argv: list[str]) -> bool:
    """Whether the command line asks for experts: ``--parallel-strategy expert_parallel``
    or ``--experts N`` (then the MoE example trains instead of digits)."""
    pair = ("--parallel-strategy", "expert_parallel")
    return any(w.startswith(MOE_FLAGS) for w in argv) or pair in itertools.pairwise(argv)


def fit_args(rest: list[str]) -> list[str]:
    """The ``core-train`` command line: the example, its config and defaults, then ``rest``."""
    if wants_moe(rest):
        return ["--example", "moe", "--config", str(MOE_CONFIG), *MOE_DEFAULTS, *rest]
    return ["--example", "digits", "--config", str(CONFIG), *DEFAULTS, *rest]


def write_results(outcome: FitOutcome, results_dir: Path) -> list[Path]:
    """Copy the run's reports into ``results_dir`` and write ``results.json`` there."""
    assert outcome.results is not None
    run_dir = outcome.results.run_dir
    results_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in REPORTS:
        if (run_dir / name).exists():
            written.append(Path(shutil.copy2(run_dir / name, results_dir / name)))
    summary = json.loads((run_dir / "results.json").read_text())
    (results_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    return [*written, results_dir / "results.json"]


def main(argv: list[str] | None = None) -> int:
    results_dir, rest = split_args(sys.argv[1:] if argv is None else argv)
    help_only = "-h" in rest or "--help" in rest
    outcome = run_fit(fit_args(rest))
    if outcome.results is None or outcome.rank != 0 or help_only:
        return outcome.exit_code
    for path in write_results(outcome, results_dir):
        print(f"written: {path}")
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
