"""The memory section of the config tree: ``MemoryConfig`` (batch-size search settings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.checks import check_bool_fields, is_finite_number, is_int, is_number
from core.errors import config_error
from core.flat_keyword import flat

__all__ = ("MemoryConfig",)


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """How the largest batch size that fits in memory is searched for.

    - ``auto_batch_size`` (default ``False``): search for the batch size before training.
      Cost: a handful of full training steps (forward, backward, optimizer step) at growing
      batch sizes, at most 12 of them, before the first real step; weights and RNG are
      restored afterwards.
    - ``target_memory_gb`` (default ``None``): the peak memory (GiB) one training step may
      use, model and optimizer state included. ``None`` means the device's free memory
      (CUDA: ``mem_get_info`` plus what torch's allocator already holds; CPU:
      ``MemAvailable``) less ``margin``. No run-time cost.
    - ``max_batch_size`` (default ``4096``): the search never tries more samples than this.
      A smaller bound also means fewer trial steps.
    - ``margin`` (default ``0.1``): the fraction of the free memory kept back for what a
      single trial step does not show (fragmentation, data loader workers, evaluation).
      Used only when ``target_memory_gb`` is ``None``; ``0 <= margin < 1``.
    """

    auto_batch_size: bool = field(default=False, metadata=flat("auto_batch_size"))
    target_memory_gb: float | None = field(default=None, metadata=flat("target_memory_gb"))
    max_batch_size: int = field(default=4096, metadata=flat("max_batch_size"))
    margin: float = field(default=0.1, metadata=flat("memory_margin"))

    def __post_init__(self) -> None:
        check_bool_fields(self)
        target = self.target_memory_gb
        if target is not None and not (is_finite_number(target) and target > 0):
            raise config_error(
                "target_memory_gb",
                target,
                "None or a finite number of GiB > 0",
                "pass e.g. target_memory_gb=8.0, or None for the device's free memory.",
            )
        if not (is_int(self.max_batch_size) and self.max_batch_size >= 1):
            raise config_error(
                "max_batch_size",
                self.max_batch_size,
                "an integer >= 1",
                "pass the largest batch size the search may try, e.g. max_batch_size=4096.",
            )
        if not (is_number(self.margin) and 0.0 <= self.margin < 1.0):
            raise config_error(
                "margin",
                self.margin,
                "a number in [0, 1)",
                "pass the fraction of free memory to keep back, e.g. margin=0.1.",
            )

    @property
    def target_bytes(self) -> int | None:
        """``target_memory_gb`` in bytes; ``None`` when unset."""
        if self.target_memory_gb is None:
            return None
        return int(self.target_memory_gb * 2**30)
