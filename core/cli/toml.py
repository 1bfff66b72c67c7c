"""The config tree as a TOML file, shaped as ``TrainingConfig.to_dict()`` shapes it: one
table per section (``[run]``, ``[precision.scaler]``), one key per leaf. TOML has no null:
``"none"`` sets an optional leaf to ``None``; classes and functions are ``"module:name"``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.cli.leaves import leaf_for, leaves, plain
from core.config import TrainingConfig
from core.errors import ConfigError, config_error

__all__ = ("dumps", "loads")

_HEADER = """\
# core-train configuration: the config tree, one table per section (flags override it).
# TOML has no null: "none" sets an optional setting to None.
"""


def _toml_module() -> Any:
    return importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")


def _sections() -> set[str]:
    found: set[str] = set()
    for leaf in leaves():
        parts = leaf.path.split(".")[:-1]
        found |= {".".join(parts[: i + 1]) for i in range(len(parts))}
    return found


def _flatten(data: Mapping[str, Any], prefix: str, sections: set[str]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and path in sections:
            flat |= _flatten(value, path + ".", sections)
        else:
            flat[path] = value
    return flat


def _normalised(path: str, value: Any) -> Any:
    """A TOML value as the leaf takes it: ``"none"``, import paths and arrays converted."""
    leaf = leaf_for(path)
    if leaf is None:
        return value  # the tree names the unknown key in its error
    special = leaf.optional or any(k not in (bool, int, float, str, Path) for k in leaf.kinds)
    try:
        if isinstance(value, str) and special:
            return leaf.parse(value)
        if isinstance(value, list):
            return leaf.parse(",".join(str(plain(v)) for v in value))
    except argparse.ArgumentTypeError:
        raise config_error(path, value, leaf.allowed()) from None
    return value


def loads(text: str, base: TrainingConfig | None = None) -> TrainingConfig:
    """The tree ``text`` describes, on top of ``base`` (default: the defaults); a bad key or
    value raises :class:`~core.errors.ConfigError` naming its dotted path."""
    toml = _toml_module()
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}. Fix: see https://toml.io") from None
    data.pop("resolved", None)  # a run's config.json part that describes, not sets
    flat = _flatten(data, "", _sections())
    values = {path: _normalised(path, value) for path, value in flat.items()}
    return (base or TrainingConfig()).replace(values)


def _value(value: object) -> str:
    shown = plain(value)
    if isinstance(shown, bool):
        return "true" if shown else "false"
    if isinstance(shown, list):
        return "[" + ", ".join(_value(v) for v in shown) + "]"
    if isinstance(shown, dict):  # an inline table (ray.runtime_env)
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(v)}" for k, v in shown.items()) + "}"
    if isinstance(shown, (int, float)):
        return repr(shown)
    return json.dumps(str(shown))


def dumps(config: TrainingConfig) -> str:
    """Every leaf of ``config`` as TOML, section by section (read back by :func:`loads`)."""
    lines = [_HEADER.rstrip("\n")]
    section = None
    tops = list(dict.fromkeys(leaf.path.split(".")[0] for leaf in leaves()))
    for leaf in sorted(
        leaves(), key=lambda x: (tops.index(x.path.split(".")[0]), x.path.count("."))
    ):
        here, _, name = leaf.path.rpartition(".")
        if here != section:
            lines += ["", f"[{here}]"]
            section = here
        node: Any = config
        for part in leaf.path.split("."):
            node = getattr(node, part)
        lines.append(f"{name} = {_value(node)}")
    return "\n".join(lines) + "\n"
