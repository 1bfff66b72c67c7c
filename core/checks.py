"""Small checks every config section shares: ``is_int`` (``True`` is not a number),
``is_number``, ``check_bool_fields`` ('no' is not a flag), ``check_writable_dir``..."""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from core.errors import config_error

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = (
    "check_bool",
    "check_bool_fields",
    "check_max_grad_norm",
    "check_writable_dir",
    "is_finite_number",
    "is_int",
    "is_number",
    "is_path",
)


def is_int(value: object) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool`` (``True`` is an int to Python, not to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[float]:
    """An ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite_number(value: object) -> TypeGuard[float]:
    """A number (see :func:`is_number`) that is neither inf nor NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_path(value: object) -> bool:
    """A non-empty ``str`` or ``os.PathLike``."""
    return isinstance(value, os.PathLike) or (isinstance(value, str) and value != "")


def check_bool(field: str, value: object) -> None:
    """Raise unless ``value`` is ``True`` or ``False`` (the string ``'no'`` is truthy)."""
    if not isinstance(value, bool):
        raise config_error(field, value, (True, False), f"pass {field}=True or {field}=False.")


def check_bool_fields(config: DataclassInstance) -> None:
    """:func:`check_bool` for every field of a config dataclass annotated ``bool``."""
    for field in fields(config):
        if field.type in ("bool", bool):
            check_bool(field.name, getattr(config, field.name))


def check_max_grad_norm(value: object) -> None:
    """Raise a :class:`~core.errors.ConfigError` naming ``max_grad_norm`` unless ``value`` is
    None (no clipping) or a finite number > 0: the one rule of every section with a clip."""
    if value is not None and not (is_finite_number(value) and value > 0):
        raise config_error(
            "max_grad_norm", value, "None (no clipping) or a finite float > 0", "try 1.0."
        )


def check_writable_dir(field: str, path: str | os.PathLike[str]) -> None:
    """Create the directory ``path`` if missing, then write and delete a probe file in it,
    so that a log directory that cannot be used fails before training, not at ``train()``."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        fix = f"{str(target)!r} is a file, not a directory; pass a directory path."
    else:
        try:
            target.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=target, prefix=".core-write-probe-"):
                return
        except OSError as exc:
            done = "cannot be created"
            if target.is_dir():
                done = "exists, but no file can be written in it"
            fix = (
                f"the directory {done} ({exc.strerror or exc}); pass another {field} or fix "
                "the permissions."
            )
    raise config_error(field, path, "a writable directory (created if missing)", fix)
