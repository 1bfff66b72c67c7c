"""``python -m examples.moe``: train the MoE example on this machine, print which experts
each class's and each domain's tokens go to before and after training, and the accuracy.

    python -m examples.moe                     # 5 epochs, well under a minute on a CPU
    python -m examples.moe --epochs 3 --experts 8 --no-progress

A sequence's class is its domain and whether its domain's marker token is frequent ("few" or
"many"); the last MoE layer's tokens carry that context, and its router learns to send each
class to an expert: the rows of its table go from spread out to one dominant expert.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from examples.moe.routing import format_table, purity
from examples.moe.train import RoutingReport, train_example


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--train-samples", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="logs")
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def show(report: RoutingReport) -> None:
    """Print the last layer's tables before and after, every layer's purity, the accuracy."""
    last = list(report.after["class"])[-1]
    for when, tables in (("before", report.before), ("after", report.after)):
        print(
            f"\n{last} {when} training: share of each class's tokens whose first choice "
            "is each expert"
        )
        print(format_table(tables["class"][last], by="class"))
    print(
        f"\n{last} after training, by domain (a domain's two classes may share an expert or not):"
    )
    print(format_table(report.after["domain"][last]))
    print("\npurity (mean over rows of the largest share; 1.0 = one expert per row):")
    for by in ("class", "domain"):
        for name in report.after[by]:
            was, now = purity(report.before[by][name]), purity(report.after[by][name])
            print(f"  by {by:<6} {name}: {was:.2f} -> {now:.2f}")
    accuracy = "n/a" if report.val_accuracy is None else f"{report.val_accuracy:.3f}"
    print(f"validation accuracy: {accuracy}   run directory: {report.run_dir}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = train_example(
        epochs=args.epochs,
        seed=args.seed,
        train_samples=args.train_samples,
        experts=args.experts,
        log_dir=args.log_dir,
        progress=not args.no_progress,
    )
    show(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
