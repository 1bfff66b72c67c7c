"""AMP's memory saving, measured: the peak of one forward+backward in fp32 minus the peak of
the same pass under the AMP precision, each read by the device's memory meter
(``core.memory.meter``: the CUDA allocator's counters, or live-storage tracking on CPU). The
model and RNGs are restored afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from core.data.batches import count_samples, to_device
from core.loop.objective import Objective
from core.loop.recovery import ErrorHandler
from core.memory.meter import meter_for
from core.memory.trial import preserved
from core.precision.plugins import FP32, Precision

__all__ = ("measure_amp_savings",)


def measure_amp_savings(
    model: nn.Module,
    batch: Any,
    *,
    objective: Objective,
    precision: Precision,
    device: torch.device,
    prepare_batch: Callable[[Any], Any] | None = None,
) -> tuple[int | None, str]:
    """``(saved_bytes, note)``: fp32's peak minus ``precision``'s for one forward+backward
    of ``batch`` (negative when AMP uses more); ``None`` and why when not measurable."""
    if not precision.uses_autocast:
        return None, "not measured: AMP resolves to fp32 here, there is nothing to compare"
    meter = meter_for(device)
    prepared = (prepare_batch or partial(to_device, device=device))(batch)
    resident = [*model.parameters(), *model.buffers()]

    def one_pass(chosen: Precision) -> None:
        with chosen.autocast():
            _, loss = objective(model, prepared)
        source = objective.loss_source_of(prepared)  # who returned a malformed loss, named
        loss = ErrorHandler().check_loss(loss, epoch=0, batch_index=0, source=source)
        loss.float().backward()

    peaks: dict[str, int] = {}
    for chosen in (FP32(), precision):
        with preserved(model):
            reading = meter.measure(partial(one_pass, chosen), resident=resident)
        peaks[chosen.name] = reading.peak_bytes - reading.start_bytes
    fp32, amp = peaks["fp32"], peaks[precision.name]
    note = (
        f"measured once on {device}: one forward+backward of {count_samples(batch)} samples "
        f"peaked at {fp32} bytes in fp32 and {amp} bytes in {precision.name}"
    )
    return fp32 - amp, note
