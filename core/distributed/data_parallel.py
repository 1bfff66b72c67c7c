"""``nn.DataParallel``: one process drives several GPUs of one machine. DDP under ``torchrun``
is faster (auto mode suggests it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from core.distributed.base import Strategy

__all__ = ("DataParallelStrategy",)


class DataParallelStrategy(Strategy):
    """Replicates the model on ``device_ids`` each forward; gradients land on the first."""

    def __init__(self, device_ids: Sequence[int]) -> None:
        super().__init__(torch.device("cuda", device_ids[0]), "data_parallel")
        self.device_ids = list(device_ids)

    def device_indices(self) -> list[int]:
        return list(self.device_ids)

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"device_ids": self.device_ids}

    def wrap_model(
        self, model: nn.Module, *, compute_dtype: torch.dtype = torch.float32
    ) -> nn.Module:
        return nn.DataParallel(model.to(self.device), device_ids=self.device_ids)

    def unwrap(self, model: nn.Module) -> nn.Module:
        inner = model.module if isinstance(model, nn.DataParallel) else model
        assert isinstance(inner, nn.Module)
        return inner
