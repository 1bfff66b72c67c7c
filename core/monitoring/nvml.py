"""NVML for the GPU monitor: one shared session, torch-to-NVML device mapping, fast counters.
Only cheap queries: utilisation, memory, temperature, power, clocks, throttle reasons.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import structlog
import torch

__all__ = (
    "NvmlReader",
    "gpu_info",
    "load_nvml",
    "nvml_acquire",
    "nvml_release",
    "shutdown_idle_nvml",
    "throttle_reason_names",
    "torch_device_handle",
)

_log = structlog.get_logger("core")

# nvmlInit costs tens to hundreds of ms (it enumerates the boards), so a process opens it
# once and keeps it between runs (shut down at exit or by shutdown_idle_nvml); a failed
# session is shut down once unused so the next user starts afresh. Sessions are kept per
# module object, so a test's fake library never touches the real one.
_session_lock = threading.Lock()
_session_users: dict[Any, int] = {}  # nvml module (held, so ids are never reused) -> users
_failed_sessions: set[Any] = set()
_exit_hook = False


def load_nvml() -> Any:
    """Import ``pynvml`` (from nvidia-ml-py); raises ImportError where it is not installed."""
    import pynvml

    return pynvml


def nvml_acquire(nvml: Any) -> None:
    """``nvmlInit`` on the first user of this library in the process (once: the session is
    kept between runs); raises what it raises."""
    global _exit_hook  # noqa: PLW0603  (registered once per process)
    with _session_lock:
        users = _session_users.get(nvml)
        if users is None:
            nvml.nvmlInit()
            users = 0
            if not _exit_hook:
                atexit.register(shutdown_idle_nvml)
                _exit_hook = True
        _session_users[nvml] = users + 1


def nvml_release(nvml: Any, *, failed: bool = False) -> None:
    """Drop one user. The session stays open for the process's next user, unless it
    ``failed`` (a driver error mid-run): then it is shut down once no one uses it."""
    with _session_lock:
        users = _session_users.get(nvml)
        if users is None:
            return
        _session_users[nvml] = max(0, users - 1)
        if failed or nvml in _failed_sessions:
            _failed_sessions.add(nvml)
            if _session_users[nvml] == 0:
                _shutdown(nvml)


def shutdown_idle_nvml() -> int:
    """``nvmlShutdown`` for every session no monitor uses (at interpreter exit); how many."""
    with _session_lock:
        idle = [nvml for nvml, users in _session_users.items() if users == 0]
        for nvml in idle:
            _shutdown(nvml)
        return len(idle)


def _shutdown(nvml: Any) -> None:  # the caller holds _session_lock
    del _session_users[nvml]
    _failed_sessions.discard(nvml)
    with contextlib.suppress(nvml.NVMLError):  # a driver gone meanwhile: nothing held
        nvml.nvmlShutdown()


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def _reason_table(nvml: Any) -> tuple[tuple[int, str], ...]:
    """(bit, snake_case name) of every single-bit clock event/throttle reason NVML defines."""
    names: dict[int, str] = {}
    # Newer NVML renamed nvmlClocksThrottleReason* to nvmlClocksEventReason*: a bit keeps
    # the first name found, so the table suits old and new bindings.
    for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
        for attr in sorted(dir(nvml)):
            value = getattr(nvml, attr)
            if not attr.startswith(prefix) or not isinstance(value, int):
                continue
            if value > 0 and value & (value - 1) == 0:  # one bit, not None/All
                names.setdefault(value, _snake(attr[len(prefix) :]))
    return tuple(sorted(names.items()))


def throttle_reason_names(nvml: Any, mask: int) -> list[str]:
    """Decode a throttle-reason bitmask, e.g. ``0x24`` -> ``["sw_power_cap", ...]``."""
    return _decode(_reason_table(nvml), mask)


def _decode(table: tuple[tuple[int, str], ...], mask: int) -> list[str]:
    names = [name for bit, name in table if mask & bit]
    known = sum(bit for bit, _ in table)
    unknown = mask & ~known
    names += [f"unknown_{1 << b:#x}" for b in range(unknown.bit_length()) if unknown >> b & 1]
    return names


def _pci_bus_id(props: Any) -> str | None:
    bus = getattr(props, "pci_bus_id", None)
    dev = getattr(props, "pci_device_id", None)
    if not isinstance(bus, int) or not isinstance(dev, int):
        return None
    domain = getattr(props, "pci_domain_id", 0)
    return f"{domain:08X}:{bus:02X}:{dev:02X}.0"


def torch_device_handle(nvml: Any, index: int) -> Any:
    """NVML's handle for torch's CUDA device ``index``."""
    # torch counts devices after CUDA_VISIBLE_DEVICES, fastest first; NVML counts every board
    # in PCI order. So: by PCI bus id, then UUID; the bare index only without CUDA (fakes).
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        keys = (
            (nvml.nvmlDeviceGetHandleByPciBusId, _pci_bus_id(props)),
            (nvml.nvmlDeviceGetHandleByUUID, f"GPU-{uuid}" if uuid is not None else None),
        )
        for lookup, key in keys:
            if key is not None:
                try:
                    return lookup(key)
                except nvml.NVMLError:
                    continue
    return nvml.nvmlDeviceGetHandleByIndex(index)


_Query = Callable[[Any], dict[str, Any]]


class NvmlReader:
    """Reads the fast counters of a fixed set of torch CUDA devices (handles cached).

    A counter the board does not support (``NVMLError_NotSupported``) reads None from then on
    and is reported once through ``on_unsupported(device, field, reason)``; any other NVML
    error propagates. No per-process queries: they take milliseconds and hold the driver lock
    the training's own CUDA calls need.
    """

    def __init__(
        self,
        nvml: Any,
        device_indices: Sequence[int],
        on_unsupported: Callable[[int, str, str], None],
    ) -> None:
        self._nvml = nvml
        self._handles = tuple((i, torch_device_handle(nvml, i)) for i in device_indices)
        self._reasons = _reason_table(nvml)
        self._on_unsupported = on_unsupported
        self._unsupported: set[tuple[int, str]] = set()
        get_reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._get_reasons = get_reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self._queries: tuple[tuple[tuple[str, ...], _Query], ...] = (
            (("util_pct", "mem_util_pct"), self._utilization),
            (("mem_used_bytes", "mem_total_bytes"), self._memory),
            (("temperature_c",), self._temperature),
            (("power_w",), lambda h: {"power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000}),
            (
                ("power_limit_w",),
                lambda h: {"power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000},
            ),
            (("sm_clock_mhz",), lambda h: {"sm_clock_mhz": self._clock(h, nvml.NVML_CLOCK_SM)}),
            (("mem_clock_mhz",), lambda h: {"mem_clock_mhz": self._clock(h, nvml.NVML_CLOCK_MEM)}),
            (("throttle_reasons",), self._throttle_reasons),
        )

    def read(self) -> list[tuple[int, dict[str, Any]]]:
        """``(torch index, counters)`` for every device, in the order given."""
        return [(index, self._read_device(index, handle)) for index, handle in self._handles]

    def _read_device(self, index: int, handle: Any) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for fields, query in self._queries:
            if (index, fields[0]) in self._unsupported:
                values.update(dict.fromkeys(fields))
                continue
            try:
                values.update(query(handle))
            except self._nvml.NVMLError_NotSupported as exc:
                self._unsupported.add((index, fields[0]))
                values.update(dict.fromkeys(fields))
                for field in fields:
                    self._on_unsupported(index, field, str(exc))
        return values

    def _utilization(self, handle: Any) -> dict[str, Any]:
        rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
        return {"util_pct": float(rates.gpu), "mem_util_pct": float(rates.memory)}

    def _memory(self, handle: Any) -> dict[str, Any]:
        info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        return {"mem_used_bytes": int(info.used), "mem_total_bytes": int(info.total)}

    def _temperature(self, handle: Any) -> dict[str, Any]:
        celsius = self._nvml.nvmlDeviceGetTemperature(handle, self._nvml.NVML_TEMPERATURE_GPU)
        return {"temperature_c": float(celsius)}

    def _clock(self, handle: Any, clock: int) -> int:
        return int(self._nvml.nvmlDeviceGetClockInfo(handle, clock))

    def _throttle_reasons(self, handle: Any) -> dict[str, Any]:
        return {"throttle_reasons": _decode(self._reasons, int(self._get_reasons(handle)))}

    def describe(self) -> dict[str, Any]:
        """Driver versions and, per torch index, name, total memory and compute capability."""
        nvml = self._nvml
        devices: dict[int, dict[str, Any]] = {}
        for index, handle in self._handles:
            name = nvml.nvmlDeviceGetName(handle)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            devices[index] = {
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "total_memory": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                "capability": (int(major), int(minor)),
            }
        driver = nvml.nvmlSystemGetDriverVersion()
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12040 for CUDA 12.4
        return {
            "device_count": int(nvml.nvmlDeviceGetCount()),
            "driver_version": driver.decode() if isinstance(driver, bytes) else str(driver),
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "devices": devices,
        }


def gpu_info(
    reader: NvmlReader | None, cuda: bool, source: str, degraded_reason: str | None
) -> dict[str, Any]:
    """What :meth:`GPUMonitor.get_gpu_info` reports (``reader``: the open NVML session)."""
    info: dict[str, Any] = {
        "device_count": torch.cuda.device_count() if cuda else 0,
        "current_device": torch.cuda.current_device() if cuda else None,
        "nvml_available": reader is not None,
        "source": source,
        "degraded_reason": degraded_reason,
        "driver_version": None,
        "cuda_driver_version": None,
        "cuda_runtime_version": torch.version.cuda,
        "devices": {},
    }
    if reader is not None:
        try:
            info |= reader.describe()
        except Exception as exc:
            _log.warning("monitor_info_failed", error=f"{type(exc).__name__}: {exc}")
    if cuda:  # torch's count, whatever NVML saw
        info["device_count"] = torch.cuda.device_count()
    return info
