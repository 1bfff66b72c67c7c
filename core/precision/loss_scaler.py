"""Dynamic loss scaling for fp16, kept entirely on the device.

``torch.amp.GradScaler`` has no hysteresis and no scale bounds, and its ``step`` reads the
overflow flag on the host. This scaler keeps its scale, growth tracker and hysteresis
budget as device tensors and updates them with tensor ops, so no step waits on the GPU;
whether a step was skipped is read back later, with the rest of the step's numbers.

Rules, per optimizer step (``update(found_inf)``):

- overflow: the growth tracker resets. While tolerated overflows remain (``hysteresis``),
  one is used up and the scale stays; otherwise the scale is multiplied by
  ``backoff_factor`` (never below ``min_scale``) and the budget refills.
- no overflow: the tracker counts up; after ``growth_interval`` clean steps the scale is
  multiplied by ``growth_factor`` (never above ``max_scale``) and the budget refills.

The optimizer step itself is skipped on overflow by the caller (see ``core.loop.stepper``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch

__all__ = ("DynamicLossScaler", "local_tensor")


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The rank-local shard of a DTensor (FSDP2 gradients), or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


class DynamicLossScaler:
    """Loss scaler with hysteresis and bounds whose state never leaves the device.

    >>> scaler = DynamicLossScaler(torch.device("cpu"), init_scale=8.0, hysteresis=1)
    >>> scaler.update(torch.ones(1)); float(scaler.scale)   # first overflow: tolerated
    8.0
    >>> scaler.update(torch.ones(1)); float(scaler.scale)   # second: back off
    4.0
    """

    def __init__(
        self,
        device: torch.device,
        *,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        hysteresis: int = 0,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
    ) -> None:
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.hysteresis = hysteresis
        self.min_scale = min_scale
        self.max_scale = max_scale
        self._scale = torch.full((), init_scale, dtype=torch.float32, device=device)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self._overflows_left = torch.full((), hysteresis, dtype=torch.int32, device=device)

    @property
    def scale(self) -> torch.Tensor:
        """The current scale, a 0-d float32 device tensor (reading it as a float syncs)."""
        return self._scale

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale

    def unscale_(self, grads: Iterable[torch.Tensor]) -> torch.Tensor:
        """Divide gradients by the scale in place; return a 0-d float ``found_inf`` flag.

        Gradients are grouped by device and dtype, as the fused kernel requires.
        """
        found_inf = torch.zeros(1, dtype=torch.float32, device=self._scale.device)
        inv_scale = self._scale.double().reciprocal().float().reshape(1)
        groups: defaultdict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(
            list
        )
        for grad in grads:
            local = local_tensor(grad)
            groups[(local.device, local.dtype)].append(local)
        for group in groups.values():
            torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv_scale)
        return found_inf.reshape(())

    def update(self, found_inf: torch.Tensor) -> None:
        """Advance the scale by one optimizer step given its overflow flag (device ops only)."""
        overflow = found_inf.reshape(()) > 0
        has_budget = self._overflows_left > 0
        back_off = overflow & ~has_budget
        tolerate = overflow & has_budget

        tracker = torch.where(
            overflow, torch.zeros_like(self._growth_tracker), self._growth_tracker + 1
        )
        grow = tracker >= self.growth_interval

        backed_off = (self._scale * self.backoff_factor).clamp(min=self.min_scale)
        grown = (self._scale * self.growth_factor).clamp(max=self.max_scale)
        new_scale = torch.where(back_off, backed_off, torch.where(grow, grown, self._scale))

        refill = back_off | grow
        overflows_left = torch.where(
            refill,
            torch.full_like(self._overflows_left, self.hysteresis),
            self._overflows_left - tolerate.to(torch.int32),
        )
        self._scale.copy_(new_scale)
        self._growth_tracker.copy_(torch.where(grow, torch.zeros_like(tracker), tracker))
        self._overflows_left.copy_(overflows_left)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            "scale": self._scale.detach().cpu().clone(),
            "growth_tracker": self._growth_tracker.detach().cpu().clone(),
            "overflows_left": self._overflows_left.detach().cpu().clone(),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._scale.copy_(state["scale"])
        self._growth_tracker.copy_(state["growth_tracker"])
        self._overflows_left.copy_(state["overflows_left"])
