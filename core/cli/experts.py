"""Where ``--experts`` and ``--parallel-strategy expert_parallel`` meet the model: the
``experts`` keyword checked against the model factory, and a model without MoE layers
refused before training starts."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from core.moe import moe_layers

__all__ = ("expert_model_problem", "experts_refused", "takes_keyword", "with_experts")

_FIX = "Fix: --example moe, or a factory with an experts parameter; or leave out --experts."


def takes_keyword(factory: Callable[..., Any], name: str) -> bool | None:
    """Whether ``factory`` takes the keyword ``name``: True, False, or None when only
    calling it tells (it takes ``**kwargs``, or has no signature to read)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.name == name and p.kind in named for p in parameters):
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return False


def _name(factory: Callable[..., Any]) -> str:
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", type(factory).__name__)
    return f"{module}:{qualname}" if module else str(qualname)


def with_experts(
    kwargs: dict[str, object], experts: int | None, factory: Callable[..., Any]
) -> dict[str, object]:
    """``kwargs`` with ``experts=experts`` added for the model factory (unchanged when
    ``experts`` is None); ``ValueError`` when ``--model-arg experts=`` sets it too or the
    factory's signature has no such keyword."""
    if experts is None:
        return kwargs
    if "experts" in kwargs:
        raise ValueError(
            f"--experts {experts} and --model-arg experts={kwargs['experts']!r} both set the "
            "model's experts; give only one of them"
        )
    if takes_keyword(factory, "experts") is False:
        raise ValueError(
            f"--experts {experts}: the model factory {_name(factory)} takes no 'experts' "
            f"keyword; allowed: a model factory with an experts parameter. {_FIX}"
        )
    return kwargs | {"experts": experts}


def experts_refused(experts: int, factory: Callable[..., Any], exc: TypeError) -> str:
    """The message for a factory (taking ``**kwargs``) that refused ``experts=``."""
    return (
        f"--experts {experts}: the model factory {_name(factory)} refused the 'experts' "
        f"keyword ({exc}); allowed: a model factory with an experts parameter. {_FIX}"
    )


def expert_model_problem(model: nn.Module, flag: str) -> str | None:
    """Why ``model`` cannot train under ``training_mode='expert_parallel'`` (set by
    ``flag``), or None when it can (it has ``core.moe.MoELayer`` blocks)."""
    if moe_layers(model):
        return None
    return (
        f"{flag} 'expert_parallel': the model ({type(model).__name__}) has no "
        "core.moe.MoELayer blocks, and expert parallelism shards their experts; allowed: a "
        "mixture-of-experts model (--example moe, or a factory whose model has MoELayer "
        "blocks). Fix: --example moe, or leave out the flag (data parallel training)."
    )
