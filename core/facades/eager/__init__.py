"""The synchronous per-batch facades of seeds 000 and 002 on the step loop's own parts: one
optimizer step per call (``EagerSteps``), seed 000's four calls (``ManualSteps``), epochs
of them (``EagerEpochs``), and AMP's measured memory saving (``measure_amp_savings``).

Each call reads its values back to the host before it returns: a synchronous facade costs
one device sync per call, by design (the run's step loop reads back one step late)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from core.facades.eager.emit import emit_to
    from core.facades.eager.epochs import EagerEpochs
    from core.facades.eager.manual import ManualSteps
    from core.facades.eager.steps import EagerSteps
    from core.memory.amp_savings import measure_amp_savings

__all__ = ("EagerEpochs", "EagerSteps", "ManualSteps", "emit_to", "measure_amp_savings")

# Each name's module loads when first asked for: importing one module of this package
# (a run imports a few) loads none of the others.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "EagerEpochs": "core.facades.eager.epochs",
        "EagerSteps": "core.facades.eager.steps",
        "ManualSteps": "core.facades.eager.manual",
        "emit_to": "core.facades.eager.emit",
        "measure_amp_savings": "core.memory.amp_savings",
    },
)
