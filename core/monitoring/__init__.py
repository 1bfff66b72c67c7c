"""Device telemetry: the NVML monitor coroutine, host sampling, and the bottleneck verdict."""
