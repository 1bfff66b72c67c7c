"""Objects named by where their maker lives: ``"package.module:function"``, with keyword
arguments when it takes some (:class:`Factory`).

A run given its model this way can cross into another process (``isolation="process"``,
``devices=N``) and records the factory in every checkpoint, so that
:func:`core.load_model` rebuilds the model from a checkpoint alone.

>>> Factory("builtins:dict", a=1)()
{'a': 1}
>>> Factory("builtins:dict", a=1).to_dict()
{'target': 'builtins:dict', 'kwargs': {'a': 1}}
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Mapping
from typing import Any

from core.errors import ConfigError, config_error

__all__ = ("FORMAT", "Factory", "factory_of", "is_factory_name", "named")

_NAME = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
FORMAT = "'package.module:function' (a module importable in a fresh process)"


def is_factory_name(value: object) -> bool:
    """Whether ``value`` is a string shaped like ``"package.module:function"``."""
    return isinstance(value, str) and bool(_NAME.match(value))


def named(field: str, name: str) -> Any:
    """The callable ``name`` stands for, imported; else a :class:`ConfigError` for ``field``."""
    if not is_factory_name(name):
        raise config_error(field, name, FORMAT)
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise config_error(
            field, name, FORMAT, f"the module cannot be imported ({exc}); check the name."
        ) from exc
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise config_error(
                field, name, FORMAT, f"{module_name} has no {attribute!r}; check the name."
            )
        target = getattr(target, part)
    if not callable(target):
        raise config_error(field, name, FORMAT, f"{attribute!r} is not callable.")
    return target


class Factory:
    """``target`` (``"package.module:function"``) called with ``kwargs``: a model or loader
    made on demand, in whichever process needs it. The keyword arguments must be JSON
    values (numbers, strings, booleans, None, lists and dicts of them): checkpoints record
    them."""

    __slots__ = ("kwargs", "target")

    def __init__(self, target: str, /, **kwargs: Any) -> None:
        if not is_factory_name(target):
            raise config_error("Factory.target", target, FORMAT)
        try:
            json.dumps(kwargs, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"Factory({target!r}) keyword arguments {kwargs!r} are invalid ({exc}); "
                "allowed: JSON values (numbers, strings, booleans, None, lists, dicts). Fix: "
                "pass plain settings and build the objects inside the factory."
            ) from exc
        self.target, self.kwargs = target, dict(kwargs)

    def __call__(self) -> Any:
        return named("Factory.target", self.target)(**self.kwargs)

    def __repr__(self) -> str:
        arguments = "".join(f", {key}={value!r}" for key, value in self.kwargs.items())
        return f"Factory({self.target!r}{arguments})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Factory) and other.to_dict() == self.to_dict()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.target, self.kwargs))

    def to_dict(self) -> dict[str, Any]:
        """What a checkpoint records: ``{"target": ..., "kwargs": {...}}``."""
        return {"target": self.target, "kwargs": dict(self.kwargs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Factory:
        return cls(str(data["target"]), **dict(data.get("kwargs") or {}))


def _rebuild(target: str, kwargs: dict[str, Any]) -> Factory:
    return Factory(target, **kwargs)


def factory_of(value: object) -> Factory | None:
    """The :class:`Factory` a run argument names (a name string or a Factory), else None."""
    if isinstance(value, Factory):
        return value
    return Factory(value) if is_factory_name(value) else None  # type: ignore[arg-type]
