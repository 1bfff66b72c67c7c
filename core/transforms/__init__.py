"""Model transforms applied before DDP/FSDP2 wrapping: activation checkpointing,
channels_last and ``torch.compile``, configured by ``ModelTransformsConfig``."""

from __future__ import annotations

from core.transforms.activation_checkpointing import (
    apply_activation_checkpointing,
    find_blocks,
    is_checkpointed,
    remove_activation_checkpointing,
)
from core.transforms.apply import TransformReport, apply_model_transforms
from core.transforms.channels_last import (
    apply_channels_last,
    channels_last_batch,
    has_conv2d,
    wants_channels_last,
)
from core.transforms.compile import EventSink, compile_model, is_compiled, wants_compile
from core.transforms.config import COMPILE_MODES, CompileMode, ModelTransformsConfig

__all__ = (
    "COMPILE_MODES",
    "CompileMode",
    "EventSink",
    "ModelTransformsConfig",
    "TransformReport",
    "apply_activation_checkpointing",
    "apply_channels_last",
    "apply_model_transforms",
    "channels_last_batch",
    "compile_model",
    "find_blocks",
    "has_conv2d",
    "is_checkpointed",
    "is_compiled",
    "remove_activation_checkpointing",
    "wants_channels_last",
    "wants_compile",
)
