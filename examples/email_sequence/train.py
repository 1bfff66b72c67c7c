"""Train the email-sequence conversion model with `await optimizer.train()`.

    python examples/email_sequence/train.py                 # what `make demo` runs
    python examples/email_sequence/train.py --epochs 1 --train-samples 2000

The same file runs unchanged under torchrun (DDP over gloo on CPU, NCCL on GPUs):

    torchrun --standalone --nproc_per_node=2 examples/email_sequence/train.py

The banner, the progress bar per epoch and the end summary come from the run's records
(`<run_dir>/events.jsonl`), on the event loop, while the model trains in a worker thread; at
the end the run writes `training_metrics.png` and `performance_summary.txt` next to them,
and keeps the checkpoint with the best validation loss apart from the newest ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from core import (
    F1Score,
    GradientAccumulationConfig,
    SignalReceived,
    create_optimized_training_optimizer,
    seed_everything,
)
from examples.email_sequence import (
    EmailSequenceDataset,
    EmailSequenceModel,
    majority_class_rate,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--train-samples", type=int, default=8000)
    parser.add_argument("--val-samples", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--accumulation-steps", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--precision", default="auto", help="auto, fp32, bf16 or fp16")
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--log-dir", default="logs")
    parser.add_argument("--experiment", default="email_sequence")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--checkpoint-every-n-steps", type=int, default=None)
    parser.add_argument("--resume", default=None, help="'auto' or a checkpoint directory")
    switch = argparse.BooleanOptionalAction
    parser.add_argument(
        "--compile",
        action=switch,
        default=False,
        help="torch.compile before the first step (default: off)",
    )
    parser.add_argument(
        "--compile-mode", default="default", help="default, reduce-overhead, max-autotune"
    )
    parser.add_argument(
        "--channels-last",
        action=switch,
        default=None,
        help="NHWC memory format (default: on for conv nets on CUDA)",
    )
    parser.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute each transformer block in backward",
    )
    parser.add_argument(
        "--auto-batch-size",
        action="store_true",
        help="split batches that do not fit the device's free memory",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        nargs=3,
        default=None,
        metavar=("WAIT", "WARMUP", "ACTIVE"),
        help="trace ACTIVE steps into <run_dir>/profile/",
    )
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    train_set = EmailSequenceDataset(args.train_samples, seed=args.seed)
    val_set = EmailSequenceDataset(args.val_samples, seed=args.seed + 1)
    seed_everything(args.seed)  # the model's initial weights too
    model = EmailSequenceModel(
        vocab_size=train_set.vocab_size,
        max_emails=train_set.max_emails,
        subject_len=train_set.subject_len,
    )
    optimizer = create_optimized_training_optimizer(
        model=model,
        train_loader=DataLoader(
            train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers
        ),
        val_loader=DataLoader(val_set, batch_size=256, num_workers=args.num_workers),
        experiment_name=args.experiment,
        max_epochs=args.epochs,
        learning_rate=args.lr,
        early_stopping_patience=args.patience,
        amp_dtype=args.precision,
        gradient_accumulation_config=GradientAccumulationConfig(args.accumulation_steps),
        max_grad_norm=1.0,
        log_dir=args.log_dir,
        seed=args.seed,
        checkpoint_every_n_steps=args.checkpoint_every_n_steps,
        resume=args.resume,
        handle_signals=True,  # this script owns its process: SIGTERM/SIGINT stop gracefully
        compile=args.compile,
        compile_mode=args.compile_mode,
        channels_last="auto" if args.channels_last is None else args.channels_last,
        activation_checkpointing=args.activation_checkpointing,
        auto_batch_size=args.auto_batch_size,
        metrics={"f1": F1Score(num_classes=2)},
        save_best=True,
        progress=not args.no_progress,
        profile_steps=tuple(args.profile_steps) if args.profile_steps else None,
    )
    rank = optimizer.rank
    stopped: SignalReceived | None = None
    try:
        results = await optimizer.train()
    except SignalReceived as exc:
        stopped = exc
    finally:
        optimizer.close()  # under torchrun: leaves the process group
    if stopped is not None:
        raise stopped
    summary = results.to_dict() | {
        "majority_class_rate": majority_class_rate(val_set),
        "amp_stats": optimizer.mixed_precision.get_amp_stats(),
    }
    if rank == 0:
        (results.run_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def report(summary: dict[str, Any]) -> None:
    run_dir = Path(summary["run_dir"])
    print(
        f"\nval_accuracy={summary['val_accuracy']:.4f} (majority class "
        f"{summary['majority_class_rate']:.4f}), val_f1={summary['val_metrics']['f1']:.4f}"
    )
    print(f"results: {run_dir / 'results.json'}")
    print(f"plots:   {run_dir / 'training_metrics.png'} (drawn in the background)")


if __name__ == "__main__":
    try:
        outcome = anyio.run(main, parse_args())
    except SignalReceived as stopped:  # checkpoint written; resume with --resume auto
        print(f"\n{stopped}", file=sys.stderr)
        sys.exit(stopped.exit_code)  # 143 after SIGTERM, 130 after SIGINT
    if int(os.environ.get("RANK", "0")) == 0:
        report(outcome)
