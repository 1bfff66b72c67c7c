"""Checking records against ``core.telemetry.records`` and rendering it as Markdown.
:func:`check_record` checks one record; :func:`schema_markdown` is the generated part of
``docs/log-schema.md`` (``python -m core.telemetry.schema_doc`` prints it).
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Mapping
from typing import Annotated, Any, Literal, NamedTuple, Union, get_args, get_origin

from core.telemetry.records import RECORDS, Common

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:
    from typing_extensions import NotRequired

__all__ = ("Field", "check_record", "fields_of", "schema_markdown")


class Field(NamedTuple):
    """One field of a record type: its name, JSON value type, presence and description."""

    name: str
    type: Any
    required: bool
    doc: str


@functools.cache
def fields_of(record_type: type) -> tuple[Field, ...]:
    """The fields of a record type (common fields first), in the order they are written."""
    result = []
    for name, annotation in inspect.get_annotations(record_type).items():
        tp: Any = annotation
        required, doc = True, ""
        if get_origin(tp) is NotRequired:
            tp, required = get_args(tp)[0], False
        if get_origin(tp) is Annotated:
            tp, doc = get_args(tp)[0], str(tp.__metadata__[0])
        result.append(Field(name, tp, required, doc))
    return tuple(result)


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _matches(value: object, tp: Any) -> bool:
    """Whether a parsed JSON value fits the declared type (bool is never a number)."""
    if tp is object or tp is Any:
        return True
    if tp is None or tp is type(None):
        return value is None
    if _is_union(tp):
        return any(_matches(value, member) for member in get_args(tp))
    if get_origin(tp) is Literal:
        return any(value == v and type(value) is type(v) for v in get_args(tp))
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if get_origin(tp) is list:
        (item,) = get_args(tp)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if get_origin(tp) is dict:
        return isinstance(value, dict)
    return isinstance(value, tp)


def check_record(record: Mapping[str, object]) -> list[str]:
    """The problems of one parsed record; an empty list when it fits its declared type."""
    event = record.get("event")
    if not isinstance(event, str) or event not in RECORDS:
        return [f"unknown event {event!r}"]
    declared = {f.name: f for f in fields_of(RECORDS[event])}
    problems = [
        f"{event}: missing field {f.name!r}"
        for f in declared.values()
        if f.required and f.name not in record
    ]
    for name, value in record.items():
        field = declared.get(name)
        if field is None:
            problems.append(f"{event}: unexpected field {name!r}")
        elif not _matches(value, field.type):
            problems.append(
                f"{event}: field {name!r} is {value!r}, declared {type_name(field.type)}"
            )
    return problems


def type_name(tp: Any) -> str:
    """A declared type in JSON words: ``float or null``, ``list of int``, ``"a" or "b"``."""
    if tp is None or tp is type(None):
        return "null"
    if _is_union(tp) or get_origin(tp) is Literal:
        members = get_args(tp)
        names = [f'"{m}"' if get_origin(tp) is Literal else type_name(m) for m in members]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    if get_origin(tp) is list:
        return f"list of {type_name(get_args(tp)[0])}"
    if get_origin(tp) is dict or tp is object:
        return "object"
    return str(tp.__name__)


def _table(fields: tuple[Field, ...]) -> list[str]:
    rows = ["| field | type | meaning |", "| --- | --- | --- |"]
    for f in fields:
        kind = type_name(f.type) + ("" if f.required else ", optional")
        rows.append(f"| `{f.name}` | {kind} | {f.doc.replace('|', '/')} |")
    return rows


def schema_markdown() -> str:
    """The generated part of docs/log-schema.md: common fields, then one table per record."""
    common = fields_of(Common)
    lines = [
        "Every line of `events.jsonl` is one record: the common fields first, then those of "
        "its `event`. Units are in the field names (`_s` seconds, `_bytes`, `_pct` percent, "
        "`_w` watts, `_c` degrees Celsius, `_mhz`). A value that may be `null` is also `null` "
        "when it is not finite (JSON has no NaN or infinity); an *optional* field appears "
        "only in the records its meaning names.",
        "",
        "**Common fields**",
        "",
        *_table(common),
    ]
    names = {f.name for f in common}
    for event, record_type in RECORDS.items():
        own = tuple(f for f in fields_of(record_type) if f.name not in names)
        doc = inspect.getdoc(record_type) or ""
        lines += ["", f"**`{event}`**: {doc}", "", *_table(own)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(schema_markdown())
