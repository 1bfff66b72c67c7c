"""The seed factory's flat keywords onto the config tree, read from the tree itself.

A flat name is declared on its field (``metadata=flat("amp_dtype")``); ``flat_settings.py``'s
typed keywords are generated from the same declarations. A flat keyword, a section object
(``multi_gpu_config=``: every leaf of it against ``config=``, the leaves it sets away from
their defaults against a flat keyword) and ``config=`` (the leaves that differ from the
defaults) that set the same leaf raise :class:`~core.errors.ConfigError` naming both.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import Field, fields, is_dataclass
from typing import Any, NamedTuple

from core.config import TrainingConfig
from core.errors import ConfigError, config_error
from core.facades.flat_settings import FlatSettings
from core.flat_keyword import flat_aliases, flat_keyword

__all__ = (
    "FLAT_KEYWORDS",
    "FlatField",
    "FlatSettings",
    "SECTION_KEYWORDS",
    "SEED_ALIASES",
    "config_from_flat",
    "flat_fields",
)


class FlatField(NamedTuple):
    """A field of the tree that declares a flat keyword (:func:`core.flat_keyword.flat`)."""

    keyword: str
    path: str
    """Its dotted path in :class:`~core.config.TrainingConfig`."""
    field: Field[Any]
    owner: type
    """The section class the field belongs to."""
    is_section: bool
    """The keyword takes a whole section object, not one leaf."""


def flat_fields() -> tuple[FlatField, ...]:
    """Every field of the tree with a flat keyword, in the tree's order (a section's keyword
    before its leaves')."""
    return tuple(_flat_fields(TrainingConfig(), ""))


def _flat_fields(node: Any, prefix: str) -> list[FlatField]:
    found: list[FlatField] = []
    for f in fields(node):
        value, path = getattr(node, f.name), f"{prefix}{f.name}"
        is_section = is_dataclass(value)
        keyword = flat_keyword(f)
        if keyword is not None:
            found.append(FlatField(keyword, path, f, type(node), is_section))
        if is_section:
            found += _flat_fields(value, path + ".")
    return found


def _check_unique(names: list[tuple[str, str]]) -> None:
    """``TypeError`` at import for a flat name two fields of the tree declare."""
    seen: dict[str, str] = {}
    for name, path in names:
        if name in seen:
            raise TypeError(
                f"the flat keyword {name!r} is declared by {seen[name]} and by {path}: "
                "give each field a name of its own in its metadata=flat(...)"
            )
        seen[name] = path


_FIELDS = flat_fields()
_check_unique(
    [(f.keyword, f.path) for f in _FIELDS]
    + [(alias, f.path) for f in _FIELDS for alias in flat_aliases(f.field)]
)

FLAT_KEYWORDS: dict[str, str] = {f.keyword: f.path for f in _FIELDS if not f.is_section}
"""Flat keyword -> dotted path of its leaf in :class:`~core.config.TrainingConfig`, read
from the fields' ``metadata=flat(...)``."""

SECTION_KEYWORDS: dict[str, str] = {f.keyword: f.path for f in _FIELDS if f.is_section}
"""Keyword taking a whole section object -> the section's name in the tree."""

SEED_ALIASES: dict[str, str] = {
    alias: f.keyword for f in _FIELDS for alias in flat_aliases(f.field)
}
"""Seed 004's names for flat keywords: an alias sets the same leaf; giving both raises."""


def config_from_flat(
    settings: Mapping[str, Any], config: TrainingConfig | None = None
) -> TrainingConfig:
    """The tree for ``settings`` (flat and section keywords) on top of ``config``."""
    _check_names(settings)
    settings = _unalias(settings)
    if config is not None and not isinstance(config, TrainingConfig):
        raise config_error("config", config, "None or a TrainingConfig")
    base = config or TrainingConfig()
    givers = _given_by_config(base) if config is not None else {}
    default = TrainingConfig()
    tree = base
    for keyword, section in SECTION_KEYWORDS.items():
        value = settings.get(keyword)
        if value is None:
            continue
        for leaf in _leaf_paths(_get(tree, section), section):
            _claim(givers, leaf, keyword, value)
        tree = _set(tree, {section: value}, {section: keyword})
        for leaf in _leaf_paths(value, section):
            # A leaf the object leaves at its default was not set there: a flat keyword
            # may set it (devices=2 beside MultiGPUConfig(training_mode="distributed")).
            if _get(tree, leaf) == _get(default, leaf):
                del givers[leaf]
    leaves = {path: settings[k] for k, path in FLAT_KEYWORDS.items() if k in settings}
    for keyword, path in FLAT_KEYWORDS.items():
        if keyword in settings:
            _claim(givers, path, keyword, settings[keyword])
    return _set(tree, leaves, {path: k for k, path in FLAT_KEYWORDS.items()})


def _unalias(settings: Mapping[str, Any]) -> dict[str, Any]:
    plain = {k: v for k, v in settings.items() if k not in SEED_ALIASES}
    for alias, keyword in SEED_ALIASES.items():
        if alias not in settings:
            continue
        if keyword in settings:
            raise config_error(
                alias,
                settings[alias],
                f"a setting given once, but {keyword} sets it too",
                f"{alias} is another name for {keyword}: pass one of them.",
            )
        plain[keyword] = settings[alias]
    return plain


def _check_names(settings: Mapping[str, Any]) -> None:
    known = FLAT_KEYWORDS.keys() | SECTION_KEYWORDS.keys() | SEED_ALIASES.keys()
    for name in settings:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"create_optimized_training_optimizer() got an unexpected keyword argument "
                f"{name!r}{hint} (settings without a flat keyword are reached with config=)"
            )


def _given_by_config(config: TrainingConfig) -> dict[str, str]:
    """The leaves ``config=`` sets: those that differ from the defaults."""
    default = TrainingConfig()
    return {
        path: "config"
        for section in fields(TrainingConfig)
        for path in _leaf_paths(getattr(config, section.name), section.name)
        if _get(config, path) != _get(default, path)
    }


def _leaf_paths(node: Any, prefix: str) -> list[str]:
    paths: list[str] = []
    for f in fields(node):
        value = getattr(node, f.name)
        path = f"{prefix}.{f.name}"
        paths += _leaf_paths(value, path) if hasattr(value, "__dataclass_fields__") else [path]
    return paths


def _get(node: Any, path: str) -> Any:
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _claim(givers: dict[str, str], path: str, keyword: str, value: object) -> None:
    if path in givers:
        first = givers[path]
        raise config_error(
            keyword,
            value,
            f"a setting given once, but {first} sets {path} too",
            f"set it in one place: drop {keyword}=..., or leave {path} out of {first}.",
        )
    givers[path] = keyword


def _set(
    tree: TrainingConfig, values: dict[str, object], keywords: dict[str, str]
) -> TrainingConfig:
    """``tree`` with ``values`` set; an error names the keyword the user writes for the
    field (``amp_min_scale``, not ``precision.scaler.min_scale``)."""
    try:
        return tree.replace(values)
    except ConfigError as exc:
        path = exc.field or ""
        keyword = keywords.get(path, path)
        message = str(exc).replace(path, keyword)
        # The section's other fields a message mentions get their flat names too:
        # "max_scale ... >= min_scale=1.0" reads "amp_max_scale ... >= amp_min_scale=1.0".
        section = path.rsplit(".", 1)[0]
        for name, other in FLAT_KEYWORDS.items():
            if other.rsplit(".", 1)[0] == section:
                leaf = other.rsplit(".", 1)[-1]
                message = re.sub(rf"(?<![.\w]){re.escape(leaf)}\b", name, message)
        error = type(exc)(message)
        error.field = keyword
        raise error from None
