"""A per-epoch verdict on what limits training speed, in plain words. ``input_bound`` when
waiting for the next batch exceeds :data:`INPUT_STALL_FRACTION` of step time (checked first: a
starved device also looks idle), ``underutilised`` when the mean utilisation is under
:data:`UNDERUTILISED_PCT` (a CPU's psutil reading divided by the torch threads), else
``compute_bound``.

>>> bottleneck_verdict(step_time_s=0.1, data_time_s=0.05, util_mean_pct=90.0,
...                    util_source="nvml")["verdict"]
'input_bound'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from core.errors import config_error

__all__ = (
    "INPUT_STALL_FRACTION",
    "UNDERUTILISED_PCT",
    "bottleneck_verdict",
    "epoch_verdict",
    "mean_util_since",
)

INPUT_STALL_FRACTION = 0.20
"""Waiting for data more than this share of the step time means input-bound."""

UNDERUTILISED_PCT = 60.0
"""Mean utilisation below this (per core for a CPU) without input stall means underutilised."""


def bottleneck_verdict(
    *,
    step_time_s: float,
    data_time_s: float,
    util_mean_pct: float | None,
    util_source: str | None,
    cpu_threads: int | None = None,
) -> dict[str, Any]:
    """Classify an epoch as ``input_bound``, ``underutilised`` or ``compute_bound``.

    ``data_time_s`` is the part of ``step_time_s`` spent waiting for batches. A ``"psutil"``
    reading is divided by ``cpu_threads`` (default: ``torch.get_num_threads()``). Returns
    ``input_stall_fraction``, ``util_mean_pct`` (as given), ``verdict`` and ``advice``.
    """
    if not step_time_s >= 0:
        raise config_error("step_time_s", step_time_s, "a number of seconds >= 0")
    if not data_time_s >= 0:
        raise config_error("data_time_s", data_time_s, "a number of seconds >= 0")
    stall = data_time_s / step_time_s if step_time_s > 0 else 0.0
    result: dict[str, Any] = {"input_stall_fraction": stall, "util_mean_pct": util_mean_pct}
    if stall > INPUT_STALL_FRACTION:
        advice = (
            f"The step waited for data {stall:.0%} of the time (more than "
            f"{INPUT_STALL_FRACTION:.0%}): the input pipeline starves the device. Raise the "
            "DataLoader's num_workers, set pin_memory=True and persistent_workers=True, or "
            "cache the decoded dataset in memory."
        )
        return result | {"verdict": "input_bound", "advice": advice}
    if util_mean_pct is not None:
        cpu = util_source == "psutil"
        threads = max(1, cpu_threads or torch.get_num_threads()) if cpu else 1
        relative = util_mean_pct / threads
        if relative < UNDERUTILISED_PCT:
            what = f"{'CPU use per thread' if cpu else 'GPU utilisation'} averaged {relative:.0f}%"
            advice = (
                f"Input keeps up (waited {stall:.0%}) but {what}, below "
                f"{UNDERUTILISED_PCT:.0f}%: each step gives the device too little work. Use "
                "a larger batch size, or torch.compile the model to cut per-kernel overhead."
            )
            return result | {"verdict": "underutilised", "advice": advice}
    known = "" if util_mean_pct is not None else " (utilisation unknown, so assumed)"
    advice = (
        f"Input keeps up (waited {stall:.0%}) and the device is busy{known}: the model's "
        "own compute is the limit. Further speed comes from bf16 mixed precision, "
        "torch.compile, or a faster device."
    )
    return result | {"verdict": "compute_bound", "advice": advice}


def mean_util_since(samples: Sequence[Mapping[str, Any]], since: float) -> float | None:
    """Mean ``util_pct`` of the first device over monitor samples taken at ``t_s >= since``."""
    values = [
        s["devices"][0]["util_pct"]
        for s in samples
        if s["t_s"] >= since and s["devices"] and s["devices"][0]["util_pct"] is not None
    ]
    return sum(values) / len(values) if values else None


class _Monitor(Protocol):
    @property
    def source(self) -> str: ...

    def get_metrics_history(self) -> list[dict[str, Any]]: ...


def epoch_verdict(
    time_s: float, data_time_s: float, monitor: _Monitor | None, started: float
) -> dict[str, Any]:
    """The verdict for an epoch that began at monitor time ``started`` (no monitor: unknown)."""
    util = None if monitor is None else mean_util_since(monitor.get_metrics_history(), started)
    source = None if monitor is None else monitor.source
    return bottleneck_verdict(
        step_time_s=time_s, data_time_s=data_time_s, util_mean_pct=util, util_source=source
    )
