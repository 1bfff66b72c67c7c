"""Distribution: one strategy interface, one small class per way of running a job
(single device, DataParallel, DDP, FSDP2), the process group, samplers, the environment
(the only reader of torchrun's variables) and the launcher. Knows nothing of precision or
monitoring."""

from __future__ import annotations

from core.distributed.base import Strategy

__all__ = ("Strategy",)
