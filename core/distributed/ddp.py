"""DistributedDataParallel: a full replica per rank, gradients all-reduced in buckets. At world
size 1 the model is not wrapped (the process group still is set up).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from core.distributed.process_group import ProcessGroupStrategy
from core.hardware.device import device_of

__all__ = ("DDPStrategy",)


class DDPStrategy(ProcessGroupStrategy):
    """DDP over the process group; off-boundary micro-batches skip the all-reduce."""

    def __init__(
        self,
        device: torch.device,
        *,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool = True,
        bucket_cap_mb: float = 25.0,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        **group: Any,
    ) -> None:
        super().__init__(device, "distributed", **group)
        self.ddp_options: dict[str, Any] = {
            "find_unused_parameters": find_unused_parameters,
            "bucket_cap_mb": bucket_cap_mb,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }
        if not broadcast_buffers:  # True is DDP's default (newer torch renames the flag)
            self.ddp_options["broadcast_buffers"] = False

    def wrap_model(
        self, model: nn.Module, *, compute_dtype: torch.dtype = torch.float32
    ) -> nn.Module:
        module = self._prepare_module(model)
        if self.world_size == 1:
            # One rank: nothing to all-reduce, and DDP's buffer broadcast, autograd hooks and
            # bucket copies would cost every step for nothing.
            return module
        device_ids = device_of(self.device).indices() or None
        return DistributedDataParallel(module, device_ids=device_ids, **self.ddp_options)

    def unwrap(self, model: nn.Module) -> nn.Module:
        inner = model.module if isinstance(model, DistributedDataParallel) else model
        assert isinstance(inner, nn.Module)
        return inner

    def no_backward_sync(self, model: nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        if not enabled or not isinstance(model, DistributedDataParallel):
            return nullcontext()  # syncing, or one rank (not wrapped)
        return model.no_sync()
