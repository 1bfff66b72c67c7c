"""GPUMonitor: NVML sampling, degradation to psutil, schedules and cleanup.

A fake pynvml module stands in for a driver only where a CPU cannot produce the case (two
GPUs, an unsupported counter, a driver failing mid-run); the tests marked ``gpu`` use the
real library.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pynvml
import pytest
import torch

from core.errors import ConfigError
from core.monitoring import nvml as core_nvml
from core.monitoring.gpu_monitor import SAMPLE_FIELDS, GPUMonitor, GPUMonitorConfig
from core.monitoring.nvml import throttle_reason_names
from core.telemetry.events import EventHub
from core.telemetry.run_log import RunLog

GIB = 1024**3
pytestmark = pytest.mark.anyio
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class NVMLError(Exception):
    """Like pynvml.NVMLError: the base of every NVML failure."""


class NVMLError_NotSupported(NVMLError):  # pynvml's name
    """Like pynvml.NVMLError_NotSupported: the board lacks this counter."""


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeNvml:
    """The part of pynvml the monitor uses, over two made-up H100s."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    nvmlClocksThrottleReasonNone = 0x0
    nvmlClocksThrottleReasonGpuIdle = 0x1
    nvmlClocksThrottleReasonSwPowerCap = 0x4
    nvmlClocksThrottleReasonHwSlowdown = 0x8
    nvmlClocksThrottleReasonAll = 0xD

    def __init__(self, devices: int = 2, unsupported: tuple[str, ...] = ()) -> None:
        self.devices = devices
        self.unsupported = set(unsupported)
        self.fail: str | None = None  # a query that raises a plain NVMLError
        self.calls: Counter[str] = Counter()
        self.util = [40 + 10 * i for i in range(devices)]
        self.clock: FakeClock | None = None
        self.query_cost_s = 0.0  # fake time a sample takes (advances self.clock)

    def _query(self, name: str) -> None:
        self.calls[name] += 1
        if name in self.unsupported:
            raise NVMLError_NotSupported("Not Supported")
        if name == self.fail:
            raise NVMLError("GPU is lost")

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        return ("handle", index)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> tuple[str, int]:
        raise NVMLError("Not Found")

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> tuple[str, int]:
        raise NVMLError("Not Found")

    def nvmlDeviceGetUtilizationRates(self, handle: tuple[str, int]) -> SimpleNamespace:
        self._query("nvmlDeviceGetUtilizationRates")
        if self.clock is not None:
            self.clock.t += self.query_cost_s
        return SimpleNamespace(gpu=self.util[handle[1]], memory=20 + handle[1])

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[str, int]) -> SimpleNamespace:
        self._query("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=(1 + handle[1]) * GIB, total=80 * GIB, free=0)

    def nvmlDeviceGetTemperature(self, handle: tuple[str, int], sensor: int) -> int:
        self._query("nvmlDeviceGetTemperature")
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 50 + handle[1]

    def nvmlDeviceGetPowerUsage(self, handle: tuple[str, int]) -> int:
        self._query("nvmlDeviceGetPowerUsage")
        return 250_000 + 1000 * handle[1]  # milliwatts

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: tuple[str, int]) -> int:
        self._query("nvmlDeviceGetEnforcedPowerLimit")
        return 700_000

    def nvmlDeviceGetClockInfo(self, handle: tuple[str, int], clock: int) -> int:
        self._query("nvmlDeviceGetClockInfo")
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: tuple[str, int]) -> int:
        self._query("nvmlDeviceGetCurrentClocksThrottleReasons")
        return 0x5 if handle[1] == 1 else 0x0

    def nvmlDeviceGetName(self, handle: tuple[str, int]) -> str:
        return "Fake H100"

    def nvmlDeviceGetCudaComputeCapability(self, handle: tuple[str, int]) -> tuple[int, int]:
        return (9, 0)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040


class Recorder:
    """An ``emit`` that keeps the records."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.records.append((event, fields))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.records if name == event]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    # The fake's devices are not torch's: map torch indices to NVML by index, as without CUDA.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    yield FakeNvml()
    core_nvml.shutdown_idle_nvml()  # the fake's session, which the process would keep


def monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "core-gpu-monitor"]


# -- sampling ---------------------------------------------------------------------------------


def test_samples_land_in_their_fields_one_record_per_device(fake: FakeNvml) -> None:
    emit = Recorder()
    monitor = GPUMonitor(device_indices=[0, 1], emit=emit, nvml=fake, clock=FakeClock())
    sample = monitor.sample()
    assert sample["source"] == "nvml" and monitor.source == "nvml" and not monitor.degraded
    first, second = sample["devices"]
    assert set(first) == set(SAMPLE_FIELDS)
    assert second == {
        "device": 1,
        "source": "nvml",
        "t_s": 100.0,
        "util_pct": 50.0,
        "mem_util_pct": 21.0,
        "mem_used_bytes": 2 * GIB,
        "mem_total_bytes": 80 * GIB,
        "temperature_c": 51.0,
        "power_w": 251.0,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "throttle_reasons": ["gpu_idle", "sw_power_cap"],
        "torch_mem_allocated_bytes": None,
        "torch_mem_reserved_bytes": None,
        "torch_max_mem_allocated_bytes": None,
    }
    assert first["device"] == 0 and first["throttle_reasons"] == []
    assert emit.named("gpu_sample") == [first, second]
    monitor.sample()
    assert len(monitor.get_metrics_history()) == 2 and len(emit.named("gpu_sample")) == 4
    assert fake.calls["nvmlInit"] == 1  # once, however many samples
    monitor.close()
    monitor.close()
    assert fake.calls["nvmlShutdown"] == 0  # kept for the process's next run
    monitor.sample()
    assert fake.calls["nvmlInit"] == 1  # the next run reuses the process's session
    monitor.close()
    assert core_nvml.shutdown_idle_nvml() >= 1  # what the interpreter's exit does
    assert fake.calls["nvmlShutdown"] == 1


def test_gpu_sample_records_reach_the_run_log_as_json(fake: FakeNvml, tmp_path: Path) -> None:
    log = RunLog.create(tmp_path, "exp", "run", rank=0, hub=EventHub())
    monitor = GPUMonitor(device_indices=[0, 1], emit=log.emit, nvml=fake)
    monitor.sample()
    monitor.close()
    log.close()
    records = [json.loads(line) for line in log.events_path.read_text().splitlines()]
    assert [(r["event"], r["device"]) for r in records] == [("gpu_sample", 0), ("gpu_sample", 1)]
    assert records[1]["throttle_reasons"] == ["gpu_idle", "sw_power_cap"]


def test_throttle_reasons_decode_with_the_real_constants() -> None:
    assert throttle_reason_names(pynvml, 0x0) == []
    assert throttle_reason_names(pynvml, 0x24) == ["sw_power_cap", "sw_thermal_slowdown"]
    assert throttle_reason_names(pynvml, 0x1 | 0x10000) == ["gpu_idle", "unknown_0x10000"]


# -- degradation ------------------------------------------------------------------------------


def test_without_pynvml_the_host_is_sampled_under_the_same_names(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_record = GPUMonitor(device_indices=[0], nvml=fake).sample()["devices"][0]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    emit = Recorder()
    monitor = GPUMonitor(device_indices=[0], emit=emit)
    for _ in range(3):
        sample = monitor.sample()
    (record,) = sample["devices"]
    assert set(record) == set(gpu_record) == set(SAMPLE_FIELDS)
    assert record["source"] == sample["source"] == monitor.source == "psutil"
    assert record["device"] == "cpu"
    assert record["util_pct"] >= 0 and 0 <= record["mem_util_pct"] <= 100
    assert 0 < record["mem_used_bytes"] <= record["mem_total_bytes"]
    gpu_only = ("temperature_c", "power_w", "power_limit_w", "sm_clock_mhz", "throttle_reasons")
    assert all(record[field] is None for field in gpu_only)
    (degraded,) = emit.named("monitor_degraded")
    assert "pynvml is not importable" in degraded["reason"]
    assert monitor.degraded and monitor.degraded_reason == degraded["reason"]
    assert len(emit.named("gpu_sample")) == 3


def test_no_cuda_device_degrades_without_touching_nvml(fake: FakeNvml) -> None:
    emit = Recorder()
    monitor = GPUMonitor(emit=emit, nvml=fake)  # all visible devices: none here
    assert monitor.sample()["source"] == "psutil"
    assert [r["reason"] for r in emit.named("monitor_degraded")] == [
        "no CUDA device visible to torch"
    ]
    assert fake.calls["nvmlInit"] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the real driver is present")
def test_the_real_library_without_a_driver_degrades_once() -> None:
    emit = Recorder()
    monitor = GPUMonitor(device_indices=[0], emit=emit)
    monitor.sample()
    monitor.sample()
    (degraded,) = emit.named("monitor_degraded")
    assert degraded["reason"].startswith("nvmlInit failed")
    monitor.close()


def test_a_driver_that_fails_to_initialise_degrades_once(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    def init() -> None:
        raise NVMLError("Driver Not Loaded")

    monkeypatch.setattr(fake, "nvmlInit", init)
    emit = Recorder()
    monitor = GPUMonitor(device_indices=[0, 1], emit=emit, nvml=fake)
    assert [monitor.sample()["source"] for _ in range(3)] == ["psutil"] * 3
    (degraded,) = emit.named("monitor_degraded")
    assert degraded["reason"] == (
        "nvmlInit failed (NVMLError: Driver Not Loaded); no NVIDIA driver?"
    )
    monitor.close()
    assert fake.calls["nvmlShutdown"] == 0  # never initialised: nothing to shut down


def test_monitors_share_one_nvml_session(fake: FakeNvml) -> None:
    first = GPUMonitor(device_indices=[0], nvml=fake)
    second = GPUMonitor(device_indices=[1], nvml=fake)
    first.sample()
    second.sample()
    assert fake.calls["nvmlInit"] == 1
    first.close()
    core_nvml.shutdown_idle_nvml()
    assert fake.calls["nvmlShutdown"] == 0  # the second still samples
    assert second.sample()["source"] == "nvml"
    second.close()
    assert fake.calls["nvmlShutdown"] == 0  # idle, kept open for the next monitor
    third = GPUMonitor(device_indices=[0], nvml=fake)
    assert third.sample()["source"] == "nvml" and fake.calls["nvmlInit"] == 1
    third.close()
    core_nvml.shutdown_idle_nvml()
    assert fake.calls["nvmlShutdown"] == 1


def test_an_unsupported_counter_is_none_and_reported_once(fake: FakeNvml) -> None:
    fake.unsupported.add("nvmlDeviceGetPowerUsage")
    emit = Recorder()
    monitor = GPUMonitor(device_indices=[0, 1], emit=emit, nvml=fake)
    for _ in range(50):
        sample = monitor.sample()
    for record in sample["devices"]:
        assert record["power_w"] is None
        assert record["power_limit_w"] == 700.0 and record["util_pct"] is not None
    assert emit.named("monitor_field_unsupported") == [
        {"device": 0, "field": "power_w", "reason": "Not Supported"},
        {"device": 1, "field": "power_w", "reason": "Not Supported"},
    ]
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 2  # not asked again
    assert not monitor.degraded and emit.named("monitor_degraded") == []


def test_an_nvml_error_mid_run_falls_back_to_psutil(fake: FakeNvml) -> None:
    emit = Recorder()
    monitor = GPUMonitor(device_indices=[0, 1], emit=emit, nvml=fake)
    assert monitor.sample()["source"] == "nvml"
    fake.fail = "nvmlDeviceGetTemperature"
    after = [monitor.sample() for _ in range(3)]  # nothing raised
    assert [s["source"] for s in after] == ["psutil"] * 3
    assert all(len(s["devices"]) == 1 for s in after)
    (degraded,) = emit.named("monitor_degraded")
    assert "GPU is lost" in degraded["reason"] and degraded["source"] == "psutil"
    assert fake.calls["nvmlShutdown"] == 1  # the session was released at once
    assert monitor.record_fields["device_util_pct"] == after[-1]["devices"][0]["util_pct"]


def test_history_stays_bounded(fake: FakeNvml) -> None:
    monitor = GPUMonitor(GPUMonitorConfig(history_size=64), device_indices=[0], nvml=fake)
    for _ in range(100_000):
        monitor.sample()
    history = monitor.get_metrics_history()
    assert len(history) == 64
    assert history[-1] is monitor.get_latest_metrics()
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 100_000


# -- schedules and cleanup --------------------------------------------------------------------


async def test_cancelling_run_stops_promptly_and_keeps_nvml_for_the_next(fake: FakeNvml) -> None:
    monitor = GPUMonitor(GPUMonitorConfig(interval_s=0.01), device_indices=[0, 1], nvml=fake)
    started = time.monotonic()
    with anyio.move_on_after(0.1):
        await monitor.run()
    assert time.monotonic() - started < 1.0
    assert len(monitor.get_metrics_history()) >= 1
    assert fake.calls["nvmlInit"] == 1 and fake.calls["nvmlShutdown"] == 0
    assert core_nvml._session_users[fake] == 0  # nobody uses it; open until exit


async def test_async_with_runs_in_the_background_and_cleans_up(fake: FakeNvml) -> None:
    async with GPUMonitor(
        GPUMonitorConfig(interval_s=0.01), device_indices=[0], nvml=fake
    ) as monitor:
        await anyio.sleep(0.05)
    assert len(monitor.get_metrics_history()) >= 2
    assert core_nvml._session_users[fake] == 0  # released (the process keeps the session)


@pytest.mark.parametrize(
    ("cost_s", "expected"),
    [(0.3, [100.0 + k for k in range(10)]), (2.5, [100.0, 103.0, 106.0, 109.0])],
)
async def test_run_keeps_a_drift_free_schedule(
    fake: FakeNvml, cost_s: float, expected: list[float]
) -> None:
    clock = FakeClock(100.0)
    fake.clock, fake.query_cost_s = clock, cost_s  # each sample takes cost_s of fake time
    with anyio.CancelScope() as scope:

        async def sleep(seconds: float) -> None:
            assert seconds > 0
            clock.t += seconds
            if clock.t >= 110.0 - 1e-9:
                scope.cancel()
            await anyio.lowlevel.checkpoint()

        monitor = GPUMonitor(device_indices=[0], nvml=fake, clock=clock, sleep=sleep)
        await monitor.run()
    times = [s["t_s"] for s in monitor.get_metrics_history()]
    assert times == pytest.approx(expected)


def test_start_and_stop_monitoring_leave_no_thread(fake: FakeNvml) -> None:
    monitor = GPUMonitor(device_indices=[0], nvml=fake)
    monitor.start_monitoring(interval=0.01)
    monitor.start_monitoring(interval=0.01)  # already running: no second thread
    assert len(monitor_threads()) == 1
    time.sleep(0.05)
    started = time.monotonic()
    monitor.stop_monitoring()
    assert time.monotonic() - started < 1.0
    assert monitor_threads() == []
    assert len(monitor.get_metrics_history()) >= 2
    assert core_nvml._session_users[fake] == 0  # released (the process keeps the session)
    with pytest.raises(ConfigError, match="interval=0 is invalid"):
        monitor.start_monitoring(interval=0)


# -- reading ----------------------------------------------------------------------------------


def test_summary_gives_mean_max_min_per_device(fake: FakeNvml) -> None:
    monitor = GPUMonitor(device_indices=[0, 1], nvml=fake)
    for util in (10, 30, 50):
        fake.util[0] = util
        monitor.sample()
    summary = monitor.get_gpu_summary()
    assert summary["samples"] == 3 and summary["source"] == "nvml"
    gpu0 = summary["devices"][0]
    assert (gpu0["util_pct_mean"], gpu0["util_pct_max"], gpu0["util_pct_min"]) == (30, 50, 10)
    assert gpu0["power_w_mean"] == 250.0
    assert gpu0["torch_mem_allocated_bytes_mean"] is None  # no CUDA: no values
    assert summary["devices"][1]["util_pct_mean"] == 50.0


def test_gpu_info_with_nvml(fake: FakeNvml) -> None:
    info = GPUMonitor(device_indices=[0, 1], nvml=fake).get_gpu_info()
    assert info["nvml_available"] and info["source"] == "nvml"
    assert info["device_count"] == 2 and info["current_device"] is None
    assert info["driver_version"] == "550.54.15" and info["cuda_driver_version"] == "12.4"
    assert info["devices"][1] == {
        "name": "Fake H100",
        "total_memory": 80 * GIB,
        "capability": (9, 0),
    }


def test_record_fields_before_and_after_a_sample(fake: FakeNvml) -> None:
    monitor = GPUMonitor(device_indices=[0, 1], nvml=fake)
    assert monitor.record_fields == {"device_util_pct": None, "device_mem_used_bytes": None}
    assert monitor.get_latest_metrics() is None
    before = monitor.record_fields
    monitor.sample()
    fields = monitor.record_fields
    assert fields == {"device_util_pct": 40.0, "device_mem_used_bytes": GIB}  # the first device
    assert before == {"device_util_pct": None, "device_mem_used_bytes": None}  # replaced


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"interval_s=0 is invalid"):
        GPUMonitorConfig(interval_s=0)
    with pytest.raises(ConfigError, match=r"history_size=0 is invalid"):
        GPUMonitorConfig(history_size=0)
    assert GPUMonitorConfig(interval_s=0.1).interval_s == 0.1


# -- the real NVML on a GPU -------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_real_nvml_values_are_sane() -> None:
    monitor = GPUMonitor(device_indices=[0])
    try:
        sample = monitor.sample()
        assert sample["source"] == "nvml", monitor.degraded_reason
        (record,) = sample["devices"]
        assert record["device"] == 0
        assert 0 <= record["util_pct"] <= 100 and 0 <= record["mem_util_pct"] <= 100
        assert 0 < record["mem_used_bytes"] <= record["mem_total_bytes"]
        assert 0 <= record["temperature_c"] <= 120
        assert record["power_w"] is None or 0 < record["power_w"] < 2000
        assert record["sm_clock_mhz"] is None or record["sm_clock_mhz"] > 0
        assert isinstance(record["throttle_reasons"], list)
        # The handle is torch's device 0, however CUDA_VISIBLE_DEVICES numbers them.
        info = monitor.get_gpu_info()
        assert info["devices"][0]["name"] == torch.cuda.get_device_name(0)
    finally:
        monitor.close()


@pytest.mark.gpu
@needs_cuda
def test_real_nvml_sees_a_256_mb_allocation() -> None:
    monitor = GPUMonitor(device_indices=[0])
    try:
        torch.cuda.init()
        before = monitor.sample()["devices"][0]
        block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()  # the allocation is done before NVML is asked
        after = monitor.sample()["devices"][0]
        grown = after["torch_mem_allocated_bytes"] - before["torch_mem_allocated_bytes"]
        assert grown >= 256 * 2**20
        assert after["mem_used_bytes"] >= before["mem_used_bytes"]
        del block
    finally:
        monitor.close()
