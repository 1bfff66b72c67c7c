"""Measure ``GET /score`` latency while the service retrains, against the idle service.

    python -m examples.email_pipeline.latency                  # 4000 recipients, 3 epochs
    python -m examples.email_pipeline.latency --concurrency 4 --isolation process

The service runs in its own process (``python -m examples.email_pipeline --port 0``), as
in production; this process is the client. It ingests synthetic recipients, trains a first
model, measures sequential (or ``--concurrency`` parallel) score requests with the service
idle, then again while a second run trains, and prints p50/p99/worst of each. With
``--isolation both`` (the default) it does so for a service training in a child process and
for one training in a thread of its own, one after the other, and compares how fast each
trained (optimizer steps per second of the measured run).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from examples.email_pipeline.simulator import synthetic_events

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipients", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--idle-requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--torch-threads", type=int, default=1, help="the service's")
    parser.add_argument("--isolation", choices=("both", "process", "thread"), default="both")
    return parser.parse_args(argv)


def percentiles(seconds: list[float]) -> tuple[float, float, float]:
    ms = sorted(1000 * s for s in seconds)
    return statistics.median(ms), ms[min(len(ms) - 1, math.ceil(0.99 * len(ms)) - 1)], ms[-1]


def stats(seconds: list[float]) -> str:
    ms = sorted(1000 * s for s in seconds)
    p99 = ms[min(len(ms) - 1, math.ceil(0.99 * len(ms)) - 1)]
    return (
        f"{len(ms)} requests: p50 {statistics.median(ms):.2f} ms, p99 {p99:.2f} ms, "
        f"worst {ms[-1]:.2f} ms"
    )


async def timed_scores(
    client: httpx.AsyncClient,
    names: list[str],
    concurrency: int,
    stop: asyncio.Event,
    limit: int | None = None,
) -> list[float]:
    """Seconds per ``GET /score`` of random recipients, ``concurrency`` workers each sending
    one request at a time, until ``stop`` is set or ``limit`` requests are answered."""
    out: list[float] = []

    async def worker() -> None:
        while not stop.is_set() and (limit is None or len(out) < limit):
            started = time.perf_counter()
            answer = await client.get(f"/score/{random.choice(names)}")
            out.append(time.perf_counter() - started)
            answer.raise_for_status()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def finish(client: httpx.AsyncClient, run_id: str) -> dict[str, object]:
    """Poll the run until the service has decided on it."""
    while not (run := (await client.get(f"/runs/{run_id}")).json())["finished"]:
        await asyncio.sleep(0.1)
    return dict(run)


async def measure(url: str, args: argparse.Namespace) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        data = synthetic_events(args.recipients, seed=0)
        payload, names = data.payload(), list(data.labels)
        for start in range(0, len(payload), 10_000):
            (await client.post("/events", json=payload[start : start + 10_000])).raise_for_status()
        await finish(client, (await client.post("/retrain")).json()["run_id"])  # model v1

        never = asyncio.Event()
        idle = await timed_scores(client, names, args.concurrency, never, args.idle_requests)

        started = time.perf_counter()  # what the service pays, its process start included
        run_id = (await client.post("/retrain")).json()["run_id"]
        stop = asyncio.Event()
        scoring = asyncio.create_task(timed_scores(client, names, args.concurrency, stop))
        while (await client.get(f"/runs/{run_id}")).json()["status"] == "running":
            await asyncio.sleep(0.1)
        wall_s = time.perf_counter() - started
        stop.set()
        busy = await scoring
        run = await finish(client, run_id)
        print(f"{len(names)} recipients, {len(payload)} events, concurrency {args.concurrency}")
        print(f"idle:           {stats(idle)}")
        print(f"while training: {stats(busy)}")
        print(
            f"run {run_id}: {run['status']}, {run['global_step']} steps in "
            f"{run['elapsed_s']:.1f} s, trained on {run['trained_on']}"
        )
        p50, p99, worst = percentiles(busy)
        steps_per_s = float(run["global_step"]) / wall_s  # type: ignore[arg-type]
        print(
            f"while training: p50 {p50:.2f} ms, p99 {p99:.2f} ms, worst {worst:.2f} ms; "
            f"{steps_per_s:.1f} steps/s from POST /retrain to the run's end "
            f"({wall_s:.1f} s)"
        )
        return steps_per_s


def main(args: argparse.Namespace) -> None:
    modes = ("process", "thread") if args.isolation == "both" else (args.isolation,)
    speed = {}
    for mode in modes:
        print(f"-- isolation={mode}", flush=True)
        speed[mode] = one_service(args, mode)
    if len(speed) == 2:
        print(f"training speed, process / thread: {speed['process'] / speed['thread']:.3f}")


def one_service(args: argparse.Namespace, isolation: str) -> float:
    with tempfile.TemporaryDirectory() as logs:
        command = [
            sys.executable,
            "-m",
            "examples.email_pipeline",
            "--port",
            "0",
            "--retrain-every",
            "0",
            "--epochs",
            str(args.epochs),
            "--log-dir",
            logs,
            "--torch-threads",
            str(args.torch_threads),
            "--isolation",
            isolation,
        ]
        server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            line = server.stdout.readline()  # "serving on http://127.0.0.1:PORT"
            if not line.startswith("serving on "):
                raise SystemExit(f"the service did not start: {line!r}")
            threading.Thread(target=server.stdout.read, daemon=True).start()  # its log lines
            return asyncio.run(measure(line.split()[-1], args))
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=60)


if __name__ == "__main__":
    main(parse_args())
