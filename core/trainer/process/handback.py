"""The trained weights' way back from a training process, through the shared memory they crossed
in (``core.trainer.process.shared``). A state dict whose names or shapes differ comes back as a
verified checkpoint instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from core.checkpointing.weights import plain_name
from core.trainer.process.shared import Packed, Slot

__all__ = ("HandBack",)


class HandBack:
    """The given model's state dict as laid out in the crossing's block."""

    def __init__(self, packed: Packed) -> None:
        self._block = packed.block
        self._slots: Mapping[str, Slot] = {plain_name(k): v for k, v in packed.model.items()}

    def fits(self, state: Mapping[str, Any]) -> bool:
        """Whether ``state`` has the given model's names and shapes."""
        plain = {plain_name(k): v for k, v in state.items()}
        return plain.keys() == self._slots.keys() and all(
            isinstance(value, torch.Tensor) and tuple(value.shape) == self._slots[name].size
            for name, value in plain.items()
        )

    @torch.no_grad()
    def write(self, state: Mapping[str, Any]) -> bool:
        """In the training process: put the trained ``state`` where the service reads it (only
        the entries not already there); False when it does not fit the given model."""
        if not self.fits(state):
            return False
        for name, value in state.items():
            slot = self._slots[plain_name(name)].view(self._block)
            if not _same_memory(slot, value):
                slot.copy_(value)
        return True

    @torch.no_grad()
    def load_into(self, model: nn.Module) -> None:
        """In the service: the trained weights into ``model``, in place, entry by entry."""
        for name, tensor in model.state_dict().items():
            tensor.copy_(self._slots[plain_name(name)].view(self._block))


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )
