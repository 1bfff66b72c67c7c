"""bottleneck_verdict: the three verdicts and their boundaries."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from core.monitoring.bottleneck import INPUT_STALL_FRACTION, UNDERUTILISED_PCT, bottleneck_verdict


def verdict(data: float, util: float | None, source: str | None = "nvml", **kw: int) -> str:
    result = bottleneck_verdict(
        step_time_s=1.0, data_time_s=data, util_mean_pct=util, util_source=source, **kw
    )
    return str(result["verdict"])


def test_thresholds_are_the_documented_ones() -> None:
    assert (INPUT_STALL_FRACTION, UNDERUTILISED_PCT) == (0.20, 60.0)


def test_waiting_for_data_over_20_percent_is_input_bound() -> None:
    result = bottleneck_verdict(
        step_time_s=0.5, data_time_s=0.2, util_mean_pct=35.0, util_source="nvml"
    )
    assert result["verdict"] == "input_bound"
    assert result["input_stall_fraction"] == pytest.approx(0.4)
    assert result["util_mean_pct"] == 35.0
    assert "num_workers" in result["advice"] and "pin_memory" in result["advice"]
    assert verdict(0.2001, 99.0) == "input_bound"
    assert verdict(0.20, 99.0) == "compute_bound"  # exactly 20% is not over


def test_low_utilisation_without_stall_is_underutilised() -> None:
    result = bottleneck_verdict(
        step_time_s=1.0, data_time_s=0.05, util_mean_pct=42.0, util_source="nvml"
    )
    assert result["verdict"] == "underutilised"
    assert "larger batch" in result["advice"] and "torch.compile" in result["advice"]
    assert verdict(0.0, 59.9) == "underutilised"
    assert verdict(0.0, 60.0) == "compute_bound"  # the threshold itself is busy enough


def test_cpu_utilisation_is_per_torch_thread() -> None:
    # psutil reads 100 per busy core: 150% over 2 threads is 75% busy, over 4 it is 37.5%.
    assert verdict(0.0, 150.0, "psutil", cpu_threads=2) == "compute_bound"
    assert verdict(0.0, 150.0, "psutil", cpu_threads=4) == "underutilised"
    assert verdict(0.0, 150.0, "nvml") == "compute_bound"


def test_unknown_utilisation_is_compute_bound_unless_input_stalls() -> None:
    result = bottleneck_verdict(
        step_time_s=1.0, data_time_s=0.1, util_mean_pct=None, util_source=None
    )
    assert result["verdict"] == "compute_bound"
    assert "unknown" in result["advice"]
    assert verdict(0.5, None, None) == "input_bound"


def test_a_zero_step_time_has_no_stall() -> None:
    result = bottleneck_verdict(
        step_time_s=0.0, data_time_s=0.0, util_mean_pct=90.0, util_source="nvml"
    )
    assert result["input_stall_fraction"] == 0.0 and result["verdict"] == "compute_bound"


def test_negative_times_are_rejected_by_name() -> None:
    with pytest.raises(ConfigError, match=r"data_time_s=-1\.0 is invalid"):
        bottleneck_verdict(step_time_s=1.0, data_time_s=-1.0, util_mean_pct=None, util_source=None)
