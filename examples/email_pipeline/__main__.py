"""Run the email pipeline service: ``python -m examples.email_pipeline --port 8000 --simulate``.

It listens on 127.0.0.1 (``--port 0``: a free port; the first line printed names it),
retrains every ``--retrain-every`` new events, and with ``--simulate`` posts synthetic
campaign traffic to itself. ``--ray-address`` (or ``EMAIL_PIPELINE_RAY_ADDRESS``) retrains
on a Ray cluster. Ctrl-C stops it; a run in flight stops at a step boundary and
keeps its checkpoint. Then, for example::

    curl -s localhost:8000/model
    curl -s localhost:8000/score/s3-7
    curl -sN localhost:8000/runs/$(curl -s -XPOST localhost:8000/retrain | jq -r .run_id)/events
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from examples.email_pipeline.app import create_app
from examples.email_pipeline.retrainer import RetrainSettings
from examples.email_pipeline.serve import serving
from examples.email_pipeline.simulator import simulate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="0: a free port")
    parser.add_argument("--simulate", action="store_true", help="post synthetic traffic")
    parser.add_argument("--recipients-per-tick", type=int, default=100)
    parser.add_argument("--tick-s", type=float, default=1.0)
    parser.add_argument(
        "--retrain-every",
        type=int,
        default=10_000,
        help="new events between runs; 0: only on POST /retrain",
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--log-dir", default="logs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="intra-op threads per thread (see main())"
    )
    parser.add_argument(
        "--isolation",
        choices=("process", "thread"),
        default="process",
        help="train in a child process (default) or a thread of the service",
    )
    parser.add_argument(
        "--ray-address",
        default=os.environ.get("EMAIL_PIPELINE_RAY_ADDRESS") or None,
        help="retrain on this Ray cluster ('auto', 'HEAD:6379'; 'local': one on this "
        "machine, started if none runs); default: $EMAIL_PIPELINE_RAY_ADDRESS, else none",
    )
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    # Scoring (event loop), training (the run's step thread) and evaluation (a worker
    # thread) each run small ops from their own thread; each such thread owns an OpenMP
    # pool, and libgomp slows every pool down once they hold more threads than there are
    # cores. One intra-op thread each keeps a score near a millisecond during training.
    torch.set_num_threads(args.torch_threads)
    settings = RetrainSettings(
        log_dir=Path(args.log_dir).absolute(),  # a Ray actor's working directory is not ours
        retrain_every=args.retrain_every or None,
        max_epochs=args.epochs,
        seed=args.seed,
        isolation=args.isolation,
        ray_address=args.ray_address,
    )
    async with serving(create_app(settings), port=args.port) as server:
        print(f"serving on {server.url}", flush=True)
        async with httpx.AsyncClient(base_url=server.url, timeout=30.0) as client:
            simulator = None
            if args.simulate:
                traffic = simulate(
                    client,
                    recipients_per_tick=args.recipients_per_tick,
                    interval_s=args.tick_s,
                    seed=args.seed + 1_000,
                )
                simulator = asyncio.create_task(traffic)
            try:
                await server.wait_closed()  # until Ctrl-C
            finally:
                if simulator is not None:
                    simulator.cancel()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parse_args()))
