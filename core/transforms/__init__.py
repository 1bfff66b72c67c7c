"""Model transforms applied before DDP/FSDP2 wrapping: activation checkpointing,
channels_last and ``torch.compile``, configured by ``ModelTransformsConfig``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

# Each name's module loads when first asked for: importing one module of this package
# (a run imports a few) loads none of the others.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "COMPILE_MODES": "core.transforms.config",
        "CompileMode": "core.transforms.config",
        "EventSink": "core.transforms.compile",
        "ModelTransformsConfig": "core.transforms.config",
        "TransformReport": "core.transforms.apply",
        "apply_activation_checkpointing": "core.transforms.activation_checkpointing",
        "apply_channels_last": "core.transforms.channels_last",
        "apply_model_transforms": "core.transforms.apply",
        "channels_last_batch": "core.transforms.channels_last",
        "compile_model": "core.transforms.compile",
        "find_blocks": "core.transforms.activation_checkpointing",
        "has_conv2d": "core.transforms.channels_last",
        "is_checkpointed": "core.transforms.activation_checkpointing",
        "is_compiled": "core.transforms.compile",
        "remove_activation_checkpointing": "core.transforms.activation_checkpointing",
        "wants_channels_last": "core.transforms.channels_last",
        "wants_compile": "core.transforms.compile",
    },
)
