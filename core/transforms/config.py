"""The model-transforms section of the config tree: ``ModelTransformsConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from core.checks import check_bool_fields
from core.errors import config_error
from core.flat_keyword import flat

__all__ = ("COMPILE_MODES", "CompileMode", "ModelTransformsConfig")

CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES: tuple[CompileMode, ...] = get_args(CompileMode)
_AUTO_OR_BOOL = ("auto", True, False)


@dataclass(frozen=True, kw_only=True)
class ModelTransformsConfig:
    """What is done to the model before it is wrapped for DDP/FSDP2, in this order:
    activation checkpointing, then channels_last, then ``torch.compile``.

    ``activation_checkpointing`` (default ``False``): ``True`` recomputes the activations of
    every repeated composite block (a class that occurs at least twice in an
    ``nn.ModuleList``/``nn.Sequential``) in the backward pass instead of keeping them; a
    tuple of class names (``("TransformerBlock",)``) picks exactly those modules. Cost: about
    one more forward pass per step (~20-35% step time); saves most activation memory.

    ``channels_last`` (default ``"auto"``: on for models with an ``nn.Conv2d`` on CUDA): the
    NHWC memory format for 4-D weights and batches, which tensor cores prefer. Cost: one
    copy of each image batch; on CPU it is rarely faster.

    ``compile`` (default ``False``): ``True`` runs ``torch.compile`` in place before the
    first step, keeping ``state_dict()`` keys. Cost: tens of seconds to minutes of
    compilation at the first step (and at each new input shape; evaluation compiles its own
    graph once); a compile failure falls back to eager mode. ``"auto"`` compiles only when
    it pays: on CUDA it times the first eager steps and compiles if the rest of the planned
    run is long enough to repay the compile time (``core.transforms.payback``); never on CPU.

    ``compile_mode`` (default ``"default"``): ``torch.compile``'s mode. ``"reduce-overhead"``
    adds CUDA graphs (more memory, static shapes); the ``"max-autotune"`` modes benchmark
    kernels (much longer compilation).

    ``compile_fullgraph`` (default ``False``): demand one graph without breaks; a model with
    a graph break then fails to compile and runs eagerly.
    """

    activation_checkpointing: bool | tuple[str, ...] = field(
        default=False, metadata=flat("activation_checkpointing", "enable_gradient_checkpointing")
    )
    channels_last: Literal["auto"] | bool = field(default="auto", metadata=flat("channels_last"))
    compile: Literal["auto"] | bool = field(default=False, metadata=flat("compile"))
    compile_mode: CompileMode = field(default="default", metadata=flat("compile_mode"))
    compile_fullgraph: bool = field(default=False, metadata=flat("compile_fullgraph"))

    def __post_init__(self) -> None:
        check_bool_fields(self)
        self._check_activation_checkpointing()
        for name in ("channels_last", "compile"):
            value = getattr(self, name)
            if not (value == "auto" or isinstance(value, bool)):
                raise config_error(
                    name, value, _AUTO_OR_BOOL, f"pass {name}='auto' to let core choose."
                )
        if self.compile_mode not in COMPILE_MODES:
            raise config_error(
                "compile_mode",
                self.compile_mode,
                COMPILE_MODES,
                "use compile_mode='default' unless profiling shows launch overhead.",
            )

    def _check_activation_checkpointing(self) -> None:
        value: object = self.activation_checkpointing
        if isinstance(value, bool):
            return
        allowed = "True, False, or a non-empty tuple of block class names"
        fix = 'e.g. activation_checkpointing=("TransformerBlock",), or True for repeated blocks.'
        if not isinstance(value, (tuple, list)) or not value:
            raise config_error("activation_checkpointing", value, allowed, fix)
        if not all(isinstance(name, str) and name for name in value):
            raise config_error("activation_checkpointing", value, allowed, fix)
        object.__setattr__(self, "activation_checkpointing", tuple(value))
