"""``GPUMonitor``: samples of the training devices on a fixed schedule, off the event loop.
Every ``interval_s`` a worker thread (NVML calls block, briefly) writes one ``gpu_sample``
record per device and updates :attr:`GPUMonitor.record_fields` for the step thread's records.
Without a usable NVML, or when it fails mid-run, one ``monitor_degraded`` record, then psutil
under the same field names. A failing monitor never raises into training.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.abc
import structlog
import torch

from core.errors import config_error
from core.monitoring.config import GPUMonitorConfig
from core.monitoring.device_metrics import (
    SAMPLE_FIELDS,
    HostReader,
    SamplingThread,
    next_tick,
    summarize,
    torch_memory,
)
from core.monitoring.nvml import NvmlReader, gpu_info, load_nvml, nvml_acquire, nvml_release

__all__ = ("GPUMonitor", "GPUMonitorConfig", "SAMPLE_FIELDS")

_log = structlog.get_logger("core")

Sample = dict[str, Any]
Emit = Callable[..., None]


class GPUMonitor:
    """Samples NVML (or, degraded, psutil) into a bounded history and the run log.

    ``device_indices`` are torch CUDA indices (None: every visible device). ``emit(event,
    **fields)`` writes a record; without it the rare notices go to structlog. ``nvml``,
    ``clock`` and ``sleep`` are seams for tests. NVML is opened on the first sample.
    """

    def __init__(
        self,
        config: GPUMonitorConfig | None = None,
        *,
        device_indices: Sequence[int] | None = None,
        emit: Emit | None = None,
        nvml: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.config = config or GPUMonitorConfig()
        self._device_indices = None if device_indices is None else tuple(device_indices)
        self._emit = emit
        self._nvml_module = nvml
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._history: deque[Sample] = deque(maxlen=self.config.history_size)
        self.record_fields: dict[str, Any] = {
            "device_util_pct": None,
            "device_mem_used_bytes": None,
        }
        """The latest sample under ``train_step``'s names; replaced, never changed in place."""
        self._opened = False
        self._nvml: Any = None  # the module, while this monitor holds an NVML session
        self._reader: NvmlReader | None = None
        self._host: HostReader | None = None
        self._host_torch_index: int | None = None
        self._cuda = False
        self._degraded_reason: str | None = None
        self._failed = False
        self._thread: SamplingThread | None = None
        self._task_group: anyio.abc.TaskGroup | None = None

    # -- opening and degrading ------------------------------------------------------------
    def _open(self) -> None:
        """Open NVML, or fall back to the host (caller holds the lock)."""
        if self._opened:
            return
        self._opened = True
        self._cuda = torch.cuda.is_available()
        indices = self._device_indices
        if indices is None:
            indices = tuple(range(torch.cuda.device_count())) if self._cuda else ()
        self._host_torch_index = indices[0] if self._cuda and indices else None
        if self._degraded_reason is not None:
            return  # NVML failed before: this monitor stays on the host
        if not indices:
            self._degrade("no CUDA device visible to torch")
            return
        try:
            nvml = self._nvml_module if self._nvml_module is not None else load_nvml()
        except ImportError as exc:
            self._degrade(f"pynvml is not importable ({exc}); install nvidia-ml-py")
            return
        try:
            nvml_acquire(nvml)
        except Exception as exc:
            self._degrade(f"nvmlInit failed ({type(exc).__name__}: {exc}); no NVIDIA driver?")
            return
        try:
            if int(nvml.nvmlDeviceGetCount()) == 0:
                raise RuntimeError("NVML sees 0 devices")
            self._reader = NvmlReader(nvml, indices, self._field_unsupported)
        except Exception as exc:
            nvml_release(nvml, failed=True)
            self._degrade(f"NVML device lookup failed ({type(exc).__name__}: {exc})")
            return
        self._nvml = nvml

    def _degrade(self, reason: str) -> None:
        self._release_nvml(failed=True)
        self._degraded_reason = reason
        self._notify("monitor_degraded", reason=reason, source="psutil")

    def _release_nvml(self, *, failed: bool = False) -> None:
        self._reader = None
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            nvml_release(nvml, failed=failed)

    def _field_unsupported(self, device: int, field: str, reason: str) -> None:
        self._notify("monitor_field_unsupported", device=device, field=field, reason=reason)

    def _notify(self, event: str, **fields: Any) -> None:
        if self._emit is not None:
            self._emit(event, **fields)
        else:
            _log.warning(event, **fields)

    # -- sampling --------------------------------------------------------------------------
    def sample(self) -> Sample:
        """Sample every device now into the history and the log; never raises.

        Returns ``{"t_s", "source", "devices": [record, ...]}``.
        """
        try:
            with self._lock:
                sample = self._take()
                self._history.append(sample)
            if self._emit is not None:
                for record in sample["devices"]:
                    self._emit("gpu_sample", **record)
        except Exception as exc:
            if not self._failed:
                self._failed = True
                _log.warning("monitor_sample_failed", error=f"{type(exc).__name__}: {exc}")
            return {"t_s": self._clock(), "source": self._source(), "devices": []}
        return sample

    def _take(self) -> Sample:
        self._open()
        t_s = self._clock()
        records: list[dict[str, Any]] = []
        if self._reader is not None:
            try:
                counters = self._reader.read()
            except Exception as exc:
                counters = []
                self._degrade(f"NVML failed mid-run ({type(exc).__name__}: {exc})")
            for index, values in counters:
                records.append(self._record(index, t_s, values, index if self._cuda else None))
        if self._reader is None:
            if self._host is None:
                self._host = HostReader()
            records.append(self._record("cpu", t_s, self._host.read(), self._host_torch_index))
        if records:
            first = records[0]
            self.record_fields = {
                "device_util_pct": first["util_pct"],
                "device_mem_used_bytes": first["mem_used_bytes"],
            }
        return {"t_s": t_s, "source": self._source(), "devices": records}

    def _record(
        self, device: int | str, t_s: float, values: dict[str, Any], torch_index: int | None
    ) -> dict[str, Any]:
        record: dict[str, Any] = dict.fromkeys(SAMPLE_FIELDS)
        record.update(values)
        record.update(torch_memory(torch_index))
        record.update(device=device, source=self._source(), t_s=t_s)
        return record

    def _source(self) -> Literal["nvml", "psutil"]:
        return "nvml" if self._reader is not None else "psutil"

    # -- schedules -------------------------------------------------------------------------
    async def run(self) -> None:
        """Sample every ``interval_s`` until cancelled, then release NVML."""
        interval = self.config.interval_s
        start = self._clock()
        tick = 0
        try:
            while True:
                await anyio.to_thread.run_sync(self.sample)  # NVML never blocks the loop
                tick, delay = next_tick(start, tick, interval, self._clock())
                await self._sleep(delay)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.close)

    async def __aenter__(self) -> GPUMonitor:
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        task_group.start_soon(self.run)
        self._task_group = task_group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task_group, self._task_group = self._task_group, None
        if task_group is not None:
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)

    def start_monitoring(self, interval: float = 2.0) -> None:
        """Sample every ``interval`` seconds in a daemon thread (for synchronous callers)."""
        if not interval > 0:
            raise config_error("interval", interval, "a number of seconds > 0")
        if self._thread is None or not self._thread.is_alive():
            self._thread = SamplingThread(self.sample, self.close, self._clock, interval)
            self._thread.start()

    def stop_monitoring(self) -> None:
        """Stop the thread of :meth:`start_monitoring` and wait for it (one sample at most)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.stop()

    def close(self) -> None:
        """Release this monitor's use of NVML (idempotent; a later sample uses it again). The
        process keeps the session open until it exits (``shutdown_idle_nvml``)."""
        with self._lock:
            self._release_nvml()
            self._opened = False

    # -- reading ---------------------------------------------------------------------------
    def get_latest_metrics(self) -> Sample | None:
        history = self._history
        return history[-1] if history else None

    def get_metrics_history(self) -> list[Sample]:
        with self._lock:
            return list(self._history)

    def get_gpu_summary(self) -> dict[str, Any]:
        """Per device, ``<field>_mean``/``_max``/``_min`` of every numeric field in the history."""
        return summarize(self.get_metrics_history()) | {"source": self.source}

    def get_gpu_info(self) -> dict[str, Any]:
        """Device count, current device, driver and CUDA versions, and per monitored device its
        name, ``total_memory`` (bytes) and compute ``capability``."""
        with self._lock:
            self._open()
            return gpu_info(self._reader, self._cuda, self._source(), self._degraded_reason)

    @property
    def source(self) -> Literal["nvml", "psutil"]:
        """Where samples come from (opens NVML on first use)."""
        with self._lock:
            self._open()
            return self._source()

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None

    @property
    def degraded_reason(self) -> str | None:
        with self._lock:
            self._open()
            return self._degraded_reason
