"""A config field's flat keyword: the one name a setting of the tree answers to as a plain
keyword argument (``amp_dtype="bf16"`` for ``precision.dtype``), declared on the field::

    dtype: AmpDtype = field(default="auto", metadata=flat("amp_dtype"))

The flat table (``core.facades.flat``), its typed keywords and the command line's flag names
are all read from these declarations; a field without one is reached through the tree only.
"""

from __future__ import annotations

from dataclasses import Field
from typing import Any

__all__ = ("flat", "flat_aliases", "flat_keyword")

_KEYWORD = "flat"
_ALIASES = "flat_aliases"


def flat(keyword: str, *aliases: str) -> dict[str, object]:
    """The field metadata naming its flat ``keyword``, and older ``aliases`` that set the
    same field (giving an alias and its keyword together is an error)."""
    return {_KEYWORD: keyword, _ALIASES: aliases}


def flat_keyword(field: Field[Any]) -> str | None:
    """The flat keyword ``field`` declares, or None."""
    keyword = field.metadata.get(_KEYWORD)
    return keyword if isinstance(keyword, str) else None


def flat_aliases(field: Field[Any]) -> tuple[str, ...]:
    """The older names of ``field``'s flat keyword."""
    return tuple(field.metadata.get(_ALIASES, ()))
