"""Cost of one ``GPUMonitor.sample()``: what a monitor tick takes from its worker thread.

Samples the devices this machine has (real NVML on a GPU machine; psutil where NVML or CUDA
is missing) with records going nowhere, and prints the median and 90th percentile in
microseconds. At ``interval_s=0.1`` a 100 us sample is 0.1% of one core.

    python -m benchmarks.monitor_sample_cost
    python -m benchmarks.monitor_sample_cost --samples 5000 --devices 0 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from core.monitoring.gpu_monitor import GPUMonitor


def _discard(event: str, **fields: Any) -> None:
    """An ``emit`` that costs what a call costs, so the figure includes building the record."""


def measure(samples: int, devices: list[int] | None) -> dict[str, Any]:
    monitor = GPUMonitor(device_indices=devices, emit=_discard)
    try:
        for _ in range(20):  # open NVML, warm caches
            monitor.sample()
        costs_us = []
        for _ in range(samples):
            start = time.perf_counter_ns()
            monitor.sample()
            costs_us.append((time.perf_counter_ns() - start) / 1000)
        latest = monitor.get_latest_metrics() or {"devices": []}
        return {
            "source": monitor.source,
            "devices": [record["device"] for record in latest["devices"]],
            "degraded_reason": monitor.degraded_reason,
            "samples": samples,
            "median_us": statistics.median(costs_us),
            "p90_us": statistics.quantiles(costs_us, n=10)[-1],
        }
    finally:
        monitor.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--devices", type=int, nargs="*", default=None, help="torch indices")
    args = parser.parse_args()
    result = measure(args.samples, args.devices)
    print(
        f"GPUMonitor.sample() [{result['source']}, devices {result['devices']}]: "
        f"median {result['median_us']:.1f} us, p90 {result['p90_us']:.1f} us "
        f"over {result['samples']} samples"
    )
    if result["degraded_reason"]:
        print(f"  (degraded: {result['degraded_reason']})")


if __name__ == "__main__":
    main()
