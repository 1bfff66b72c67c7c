"""The model transforms, applied in their fixed order before the model is wrapped for
DDP/FSDP2: activation checkpointing, then channels_last, then ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from core.hardware.device import device_of
from core.transforms.activation_checkpointing import apply_activation_checkpointing, find_blocks
from core.transforms.channels_last import apply_channels_last, wants_channels_last
from core.transforms.compile import EventSink, compile_model, compile_reason, wants_compile
from core.transforms.config import ModelTransformsConfig

__all__ = ("TransformReport", "apply_model_transforms")


@dataclass(frozen=True)
class TransformReport:
    """What :func:`apply_model_transforms` did: the blocks checkpointed, whether weights are
    channels_last, and the compiled targets (``("model",)`` or block names)."""

    activation_checkpointed: tuple[str, ...] = ()
    channels_last: bool = False
    compiled: tuple[str, ...] = ()
    compile: str = "off: compile=False (the default)"
    """Why it is compiled or not (``core.transforms.compile.compile_reason``)."""
    compile_deferred: bool = False
    """``compile="auto"`` on CUDA: the step loop decides after timing eager steps."""

    def to_dict(self) -> dict[str, object]:
        """The report as JSON-ready values, for the ``run_start`` record."""
        return {
            "activation_checkpointed": list(self.activation_checkpointed),
            "channels_last": self.channels_last,
            "compiled": list(self.compiled),
            "compile": self.compile,
        }


def apply_model_transforms(
    model: nn.Module,
    config: ModelTransformsConfig,
    device: torch.device,
    *,
    emit: EventSink,
    report_error: EventSink,
    compile_blocks: bool = False,
    before_compile: Callable[[nn.Module], None] | None = None,
) -> TransformReport:
    """Apply ``config`` to ``model`` in place (call it after the model is on ``device`` and
    before DDP/FSDP2 wraps it). ``compile_blocks=True`` (the FSDP2 path) compiles each
    block instead of the whole model: the checkpointed block classes when they were named,
    else the repeated blocks :func:`find_blocks` finds, else the whole model.
    ``before_compile`` is called with the model after channels_last and before compilation
    (whether or not it compiles), e.g. to search the batch size on the eager model.
    """
    setting = config.activation_checkpointing
    block_types = setting if isinstance(setting, tuple) else None
    checkpointed = []
    if setting is not False:
        checkpointed = apply_activation_checkpointing(model, block_types)
    channels_last = wants_channels_last(config.channels_last, model, device)
    if channels_last:
        apply_channels_last(model)
    if before_compile is not None:
        before_compile(model)
    compiled: list[str] = []
    if wants_compile(config.compile, device):
        blocks = [name for name, _ in find_blocks(model, block_types)] if compile_blocks else []
        compiled = compile_model(
            model,
            mode=config.compile_mode,
            fullgraph=config.compile_fullgraph,
            blocks=blocks or None,
            emit=emit,
            report_error=report_error,
        )
    return TransformReport(
        activation_checkpointed=tuple(checkpointed),
        channels_last=channels_last,
        compiled=tuple(compiled),
        compile=compile_reason(config.compile, device, blocks=compile_blocks),
        compile_deferred=(
            config.compile == "auto" and device_of(device).is_cuda and not compile_blocks
        ),
    )
