"""What follows a backward, written once: the gradients become an optimizer step.

:class:`GradientUpdate` is the one place in ``core`` that turns accumulated gradients into
an update, and every path that trains takes it: the step loop's kernels
(``core.loop.step``), the per-batch ``optimizer_step`` call (``core.facades.eager.manual``),
``benchmark_performance`` (``core.trainer.job.benchmark``) and the learning-rate finder
(``core.tuning.lr_finder``). In order:

1. unscale the gradients in place, with an overflow flag (fp16 only), combined over ranks;
2. the global gradient 2-norm, on the device (no host sync), and the in-place clip to
   ``max_grad_norm``;
3. ``before_step()``: the caller's moment between the clip and the update (the loop settles
   step N-1 here, after step N's backward is queued);
4. the optimizer step, or its skip on overflow or non-finite gradients (``core.loop.stepper``:
   on the device for fused optimizers on CUDA);
5. ``pack(grad_norm, skipped, loss_scale, lr)``: what the caller keeps of the step, taken
   while the loss scale is still the one this step used;
6. the loss-scale update (fp16 only) and the gradients cleared (set to None).

A precision without loss scaling (fp32, bf16) skips steps 1 and 6's scale update entirely:
no call is made that would do nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from operator import attrgetter, is_not
from typing import TypeVar

import torch

from core.checks import is_finite_number
from core.distributed.base import Strategy
from core.errors import config_error
from core.loop.stepper import SkipFlag, stepper_for
from core.precision.plugins import Precision

__all__ = ("GradientUpdate", "Pack", "check_max_grad_norm", "keep_nothing")

T = TypeVar("T")
Pack = Callable[[torch.Tensor, SkipFlag, torch.Tensor | None, float], T]
"""What a caller keeps of a step: called with the gradient norm (a device tensor), the skip
flag, the loss scale this step used (a device tensor, None without scaling) and the LR."""


_grad_of = attrgetter("grad")
_is_not_none = partial(is_not, None)


def check_max_grad_norm(value: object) -> None:
    """Raise a :class:`~core.errors.ConfigError` naming ``max_grad_norm`` unless ``value`` is
    None (no clipping) or a finite number > 0: the one rule wherever a clip is set."""
    if value is not None and not (is_finite_number(value) and value > 0):
        raise config_error(
            "max_grad_norm", value, "None (no clipping) or a finite float > 0", "try 1.0."
        )


def keep_nothing(*_: object) -> None:
    """A ``pack`` for a caller that keeps nothing of the step (a timing, a sweep)."""


def _nothing() -> None:
    """The default ``before_step``: nothing to do between the clip and the update."""


class GradientUpdate:
    """The post-backward sequence of the module docstring, for one optimizer.

    Example::

        update = GradientUpdate(optimizer, Strategy(cpu), max_grad_norm=1.0,
                                guard_nonfinite=True)
        loss.backward()
        norm = update(FP32(), lambda norm, skipped, scale, lr: norm)
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        strategy: Strategy,
        *,
        max_grad_norm: float | None,
        guard_nonfinite: bool,
        params: Sequence[torch.nn.Parameter] | None = None,
    ) -> None:
        check_max_grad_norm(max_grad_norm)
        self.optimizer = optimizer
        self.params = list(
            params
            if params is not None
            else (p for group in optimizer.param_groups for p in group["params"])
        )
        self.strategy = strategy
        self.max_grad_norm = max_grad_norm
        self.stepper = stepper_for(optimizer, strategy.device, guard_nonfinite=guard_nonfinite)

    def __call__(
        self, precision: Precision, pack: Pack[T], before_step: Callable[[], object] = _nothing
    ) -> T:
        """Apply (or skip) one optimizer step from the gradients the backward left; return
        what ``pack`` made of it."""
        params, strategy = self.params, self.strategy
        grads = list(filter(_is_not_none, map(_grad_of, params)))  # C all the way: no frame
        scaled = precision.scales_loss
        found_inf = strategy.reduce_found_inf(precision.unscale_(grads)) if scaled else None
        grad_norm = strategy.total_norm(grads)  # a device tensor: no host sync
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(params, self.max_grad_norm, grad_norm)
        before_step()
        lr = float(self.optimizer.param_groups[0]["lr"])  # after the previous scheduler step
        skipped = self.stepper.step(found_inf, grad_norm)
        kept = pack(grad_norm, skipped, precision.loss_scale if scaled else None, lr)
        if scaled:
            precision.update(found_inf)
        self.optimizer.zero_grad(set_to_none=True)
        return kept
