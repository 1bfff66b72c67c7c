"""Dynamic loss scaling for fp16, kept entirely on the device. The scale, growth tracker and
hysteresis budget are device tensors updated with tensor ops, so no step waits on the GPU.
Unlike ``torch.amp.GradScaler`` it has hysteresis (as DeepSpeed defines it) and scale bounds;
``hysteresis=1`` reproduces GradScaler's scale and skipped steps within the bounds.
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

    ``hysteresis`` is the number of overflows that trigger a back-off (1, the default,
    backs off on every overflow as ``torch.amp.GradScaler`` does); the budget refills when
    the scale grows, or after every clean step with ``consecutive_hysteresis=True``, never
    after a back-off. The optimizer step itself is skipped on every overflow by the caller
    (``core.loop.step``), whatever the scale does.

    >>> overflow, clean = torch.ones(()), torch.zeros(())
    >>> scaler = DynamicLossScaler(torch.device("cpu"), init_scale=8.0, hysteresis=2)
    >>> scaler.update(overflow); float(scaler.scale)  # 1st overflow: absorbed
    8.0
    >>> scaler.update(overflow); float(scaler.scale)  # 2nd: back off
    4.0
    >>> scaler.update(overflow); float(scaler.scale)  # budget spent: back off again
    2.0
    >>> scaler = DynamicLossScaler(
    ...     torch.device("cpu"), init_scale=8.0, hysteresis=2, consecutive_hysteresis=True
    ... )
    >>> for flag in (overflow, clean, overflow, clean, overflow): scaler.update(flag)
    >>> float(scaler.scale)  # each clean step refilled the budget
    8.0
    """

    def __init__(
        self,
        device: torch.device,
        *,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        hysteresis: int = 1,
        consecutive_hysteresis: bool = False,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
    ) -> None:
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.hysteresis = hysteresis
        self.consecutive_hysteresis = consecutive_hysteresis
        self.min_scale = min_scale
        self.max_scale = max_scale
        # Overflows absorbed before a back-off when the budget is full (the config asks for
        # hysteresis >= 1; anything lower acts as 1).
        self._full_budget = max(hysteresis - 1, 0)
        self._scale = torch.full((), init_scale, dtype=torch.float32, device=device)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self._overflows_left = torch.full((), self._full_budget, dtype=torch.int32, device=device)

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
        left = self._overflows_left
        # An overflow the budget (``overflows_left``, DeepSpeed's ``cur_hysteresis - 1``) no
        # longer absorbs backs off; DeepSpeed stops the run at min_scale, this stays there.
        back_off = overflow & (left <= 0)

        # Clean steps in a row since the last overflow or growth, counted as GradScaler's
        # tracker and DeepSpeed's ``(cur_iter - last_overflow_iter) % scale_window`` count them
        # (newer DeepSpeed waits scale_window + 1 steps for the first growth after an overflow).
        tracker = torch.where(
            overflow, torch.zeros_like(self._growth_tracker), self._growth_tracker + 1
        )
        grow = tracker >= self.growth_interval

        backed_off = (self._scale * self.backoff_factor).clamp(min=self.min_scale)
        grown = (self._scale * self.growth_factor).clamp(max=self.max_scale)
        new_scale = torch.where(back_off, backed_off, torch.where(grow, grown, self._scale))

        # An absorbed overflow uses one unit; a back-off leaves the (empty) budget as is, so
        # once spent every overflow backs off until a refill: a growth, or any clean step
        # with consecutive_hysteresis (a back-off then takes ``hysteresis`` overflows in a row).
        spent = torch.where(overflow, (left - 1).clamp(min=0), left)
        refill = ~overflow if self.consecutive_hysteresis else grow
        overflows_left = torch.where(refill, torch.full_like(left, self._full_budget), spent)

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
