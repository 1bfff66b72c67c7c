"""Activation checkpointing in place: each chosen block's forward runs under
``torch.utils.checkpoint`` (non-reentrant), so its activations are recomputed in the backward
pass instead of kept. The module tree and ``state_dict()`` keys do not change.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from core.errors import ConfigError, config_error

__all__ = (
    "BlockTypes",
    "apply_activation_checkpointing",
    "find_blocks",
    "is_checkpointed",
    "remove_activation_checkpointing",
)

BlockTypes = Sequence[str | type[nn.Module]]
_FIELD = "activation_checkpointing"


class _CheckpointedForward:
    """An instance-level ``forward`` that runs ``inner`` (the previous ``module.forward``)
    under checkpoint; ``had_instance_forward``: it was an instance attribute to restore."""

    __slots__ = ("had_instance_forward", "inner")

    def __init__(self, inner: Callable[..., Any], had_instance_forward: bool) -> None:
        self.inner = inner
        self.had_instance_forward = had_instance_forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation: nothing is saved, nothing to recompute
            return self.inner(*args, **kwargs)
        # Keyword arguments travel in a partial so that none can clash with checkpoint's own.
        fn = functools.partial(self.inner, **kwargs) if kwargs else self.inner
        return checkpoint(fn, *args, use_reentrant=False)


def is_checkpointed(module: nn.Module) -> bool:
    """Whether ``module``'s forward runs under activation checkpointing (set by this module)."""
    return isinstance(module.__dict__.get("forward"), _CheckpointedForward)


def _has_children(module: nn.Module) -> bool:
    return next(module.children(), None) is not None


def _matches(module: nn.Module, block_types: BlockTypes) -> bool:
    for kind in block_types:
        if isinstance(kind, str):
            if type(module).__name__ == kind or type(module).__qualname__ == kind:
                return True
        elif isinstance(module, kind):
            return True
    return False


def _repeated_children(container: nn.Module) -> set[int]:
    """ids of the repeated composite children of a ModuleList/Sequential."""
    counts = Counter(type(child) for child in container.children())
    return {
        id(child)
        for child in container.children()
        if counts[type(child)] >= 2 and _has_children(child)
    }


def find_blocks(
    model: nn.Module, block_types: BlockTypes | None = None
) -> list[tuple[str, nn.Module]]:
    """The blocks to checkpoint (or compile), outermost first, as ``(qualified name, module)``.

    Without ``block_types``: children of an ``nn.ModuleList``/``nn.Sequential`` whose class
    occurs there at least twice and that have submodules (a transformer's layers, not a
    lone ``nn.Linear``). With ``block_types`` (class names or classes): every submodule of
    those classes. A block inside another chosen block is never chosen.

    >>> model = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2)))
    >>> [name for name, _ in find_blocks(model)]
    ['0', '1']
    """
    repeated: set[int] = set()
    if block_types is None:
        for module in model.modules():
            if isinstance(module, (nn.ModuleList, nn.Sequential)):
                repeated |= _repeated_children(module)
    chosen: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if module is model or any(name.startswith(f"{outer}.") for outer, _ in chosen):
            continue
        hit = id(module) in repeated if block_types is None else _matches(module, block_types)
        if hit:
            chosen.append((name, module))
    return chosen


def _composite_classes(model: nn.Module) -> list[str]:
    names = {type(m).__name__ for m in model.modules() if m is not model and _has_children(m)}
    return sorted(names - {"ModuleList", "Sequential", "ModuleDict"})


def _nothing_found(model: nn.Module, block_types: BlockTypes | None) -> ConfigError:
    candidates = _composite_classes(model)
    example = candidates[0] if candidates else "MyBlock"
    allowed = (
        f"class names of modules in {type(model).__name__} (composite ones: "
        f"{', '.join(candidates) or 'none'})"
    )
    if block_types is None:
        return config_error(
            _FIELD,
            True,
            allowed,
            f"{type(model).__name__} has no block class repeated in an nn.ModuleList or "
            f'nn.Sequential; name the blocks: activation_checkpointing=("{example}",).',
        )
    value = tuple(k if isinstance(k, str) else k.__name__ for k in block_types)
    return config_error(
        _FIELD,
        value,
        allowed,
        f'no submodule has one of these classes; e.g. activation_checkpointing=("{example}",).',
    )


def apply_activation_checkpointing(
    model: nn.Module, block_types: BlockTypes | None = None
) -> list[str]:
    """Checkpoint the blocks :func:`find_blocks` chooses, in place; returns their names.

    Idempotent. Raises ``ConfigError`` when no block is found, naming the fix.
    """
    blocks = find_blocks(model, block_types)
    if not blocks:
        raise _nothing_found(model, block_types)
    for _, module in blocks:
        if is_checkpointed(module):
            continue
        had_instance_forward = "forward" in module.__dict__
        wrapper = _CheckpointedForward(module.forward, had_instance_forward)
        object.__setattr__(module, "forward", wrapper)
    return [name for name, _ in blocks]


def remove_activation_checkpointing(model: nn.Module) -> list[str]:
    """Undo :func:`apply_activation_checkpointing`; returns the names of the blocks restored."""
    restored = []
    for name, module in model.named_modules():
        wrapper = module.__dict__.get("forward")
        if not isinstance(wrapper, _CheckpointedForward):
            continue
        if wrapper.had_instance_forward:
            object.__setattr__(module, "forward", wrapper.inner)
        else:
            del module.__dict__["forward"]
        restored.append(name)
    return restored
