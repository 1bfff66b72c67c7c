"""Throughput of the mixture-of-experts example: one process against expert parallelism.

    python -m benchmarks.moe                    # launches the jobs, prints a markdown table
    python -m benchmarks.moe --quick --json moe.json

1. One process (``training_mode="cpu"``, or ``single_gpu``): every expert local.
2. Two expert-parallel ranks under torchrun (gloo on CPU, NCCL on 2+ GPUs): each rank holds
   half of every layer's experts, tokens exchanged by ``all_to_all_single``; per-rank and
   global tokens/s, and the exchange's share of the training time (the seconds the
   strategy's ``TokenExchange`` spent in its collectives, waiting for the other rank
   included, over the training time).
3. The same with ``expert_token_exchange="all_gather"`` (the fallback for backends without
   all-to-all: every rank receives every rank's tokens).

Tokens/s is ``TrainingResults.samples_per_s`` times the sequence length (training time
only; start-up, validation and process launch excluded), the median over ``--rounds``
after a warm-up job. CPU runs use one torch thread per process, so 2 ranks use the 2 cores
the single process could not: compare the global figure with 2 x the single one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core import MultiGPUConfig, create_optimized_training_optimizer  # noqa: E402
from core.multi_gpu_training import setup_distributed_environment  # noqa: E402
from examples.moe import build_model, domain_sequences  # noqa: E402

PARALLEL = ("all_to_all", "all_gather")


def _model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(
        seq_len=args.seq_len,
        d_model=args.d_model,
        heads=args.heads,
        layers=args.layers,
        experts=args.experts,
        top_k=args.top_k,
    )


def job(mode: str, args: argparse.Namespace, log_dir: Path, world_size: int) -> dict[str, float]:
    """One training run: this rank's tokens/s, training seconds and exchange seconds."""
    samples = args.batch_size * args.steps * world_size
    data = domain_sequences(samples, seq_len=args.seq_len, seed=0)
    single = "single_gpu" if torch.cuda.is_available() else "cpu"
    config = MultiGPUConfig(
        training_mode=single if mode == "single" else "expert_parallel",  # type: ignore[arg-type]
        expert_token_exchange="auto" if mode == "all_to_all" else "all_gather",
    )
    optimizer = create_optimized_training_optimizer(
        model=_model(args),
        train_loader=DataLoader(data, batch_size=args.batch_size, shuffle=True),
        max_epochs=args.epochs,
        learning_rate=1e-3,
        max_grad_norm=1.0,
        amp_dtype=args.precision,
        log_dir=log_dir,
        experiment_name=f"bench_moe_{mode}",
        multi_gpu_config=config,
        progress=False,
        reports=False,
    )
    results = anyio.run(optimizer.train)
    exchange = getattr(optimizer._built.strategy, "exchange", None)
    optimizer.close()
    local = args.batch_size * args.steps * args.epochs
    train_s = local / results.samples_per_s
    return {
        "tokens_per_s": results.samples_per_s * args.seq_len,
        "train_s": train_s,
        "exchange_s": exchange.seconds if exchange is not None else 0.0,
        "exchange_calls": exchange.calls if exchange is not None else 0,
    }


def worker(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = ["single"]
    world_size, rank = 1, 0
    if args.parallel:
        info = setup_distributed_environment()
        world_size, rank = info["world_size"], info["rank"]
        modes = list(PARALLEL)
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        job(modes[0], args, Path(tmp), world_size)  # warm-up
        for round_ in range(args.rounds):
            for mode in modes if round_ % 2 == 0 else modes[::-1]:
                runs[mode].append(job(mode, args, Path(tmp), world_size))
    medians = {
        mode: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        for mode, rounds in runs.items()
    }
    Path(f"{args.out}.rank{rank}").write_text(json.dumps(medians))
    if args.parallel:
        torch.distributed.destroy_process_group()


def _worker_args(args: argparse.Namespace, out: Path) -> list[str]:
    return [
        "--worker",
        "--out",
        str(out),
        "--rounds",
        str(args.rounds),
        "--steps",
        str(args.steps),
        "--epochs",
        str(args.epochs),
        "--threads",
        str(args.threads),
        "--batch-size",
        str(args.batch_size),
        "--precision",
        args.precision,
        "--seq-len",
        str(args.seq_len),
        "--d-model",
        str(args.d_model),
        "--heads",
        str(args.heads),
        "--layers",
        str(args.layers),
        "--experts",
        str(args.experts),
        "--top-k",
        str(args.top_k),
    ]


def launch(nproc: int, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Run the workers (torchrun for ranks, a plain process alone); every rank's medians."""
    script = [str(Path(__file__)), *_worker_args(args, out)]
    if nproc > 1:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            *script,
            "--parallel",
        ]
    else:
        command = [sys.executable, *script]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads or 1), "PYTHONPATH": path}
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(nproc)]


SIZES = ("batch_size", "seq_len", "d_model", "heads", "layers", "experts", "top_k", "steps")


def summarise(
    one: dict[str, Any], ranks: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """The table's rows (and the sizes they were measured with) from the workers' medians."""
    single = one["single"]["tokens_per_s"]
    rows: dict[str, Any] = {
        "single": {
            "processes": 1,
            "per_rank_tokens_per_s": single,
            "global_tokens_per_s": single,
            "exchange_share": None,
        }
    }
    steps = args.steps * args.epochs
    for mode in PARALLEL:
        per_rank = [r[mode]["tokens_per_s"] for r in ranks]
        share = [r[mode]["exchange_s"] / r[mode]["train_s"] for r in ranks]
        rows[f"expert_parallel/{mode}"] = {
            "processes": len(ranks),
            "per_rank_tokens_per_s": statistics.mean(per_rank),
            "global_tokens_per_s": sum(per_rank),
            "exchange_share": statistics.mean(share),
            "exchange_calls_per_step": ranks[0][mode]["exchange_calls"] / steps,
        }
    for row in rows.values():
        row["global_vs_single"] = row["global_tokens_per_s"] / single
    return {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "threads_per_process": args.threads,
        "sizes": {k: getattr(args, k) for k in SIZES},
        "rows": rows,
    }


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| run | processes | tokens/s per rank | tokens/s global | global / single | "
        "exchange share of step time |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in summary["rows"].items():
        share = "-" if row["exchange_share"] is None else f"{100 * row['exchange_share']:.1f} %"
        lines.append(
            f"| {name} | {row['processes']} | {row['per_rank_tokens_per_s']:,.0f} | "
            f"{row['global_tokens_per_s']:,.0f} | {row['global_vs_single']:.2f} | {share} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    cpu = not torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parallel", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="1 round of 10 steps (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per epoch and rank")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per rank and step")
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=4, help="per MoE layer (even: 2 ranks)")
    parser.add_argument("--top-k", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1 if cpu else 0)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.epochs = 1, 10, 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        raise SystemExit("benchmarks.moe needs 2 CUDA GPUs for its 2 ranks, or none (CPU).")
    with tempfile.TemporaryDirectory() as tmp:
        (one,) = launch(1, args, Path(tmp) / "one.json")
        ranks = launch(2, args, Path(tmp) / "two.json")
    summary = summarise(one, ranks, args)
    print(table(summary))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
