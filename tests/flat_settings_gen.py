"""``core/facades/flat_settings.py`` (the ``FlatSettings`` TypedDict) drawn from the config
tree: one key per flat keyword, alias and section keyword the tree's fields declare
(``metadata=flat(...)``), each typed with its field's annotation.

Regenerate it with::

    python -m tests.flat_settings_gen
"""

from __future__ import annotations

import builtins
import difflib
import re
import sys
from pathlib import Path

from core.facades.flat import FlatField, flat_fields
from core.flat_keyword import flat_aliases

FILE = Path(__file__).resolve().parent.parent / "core" / "facades" / "flat_settings.py"
COMMAND = "python -m tests.flat_settings_gen"
_HEADER = """\
\"\"\"The seed factory's settings keywords, typed: one key per flat keyword, seed alias and
section keyword the config tree's fields declare (``metadata=flat(...)``).

Generated from the tree by ``{command}``: do not edit by hand (a test
fails when the tree and this file disagree).
\"\"\"

from __future__ import annotations

"""
_STRING = re.compile(r"'[^']*'|\"[^\"]*\"")
_NAME = re.compile(r"[A-Za-z_]\w*")


def _annotation(entry: FlatField) -> str:
    """The field's annotation as written in its section (a section keyword: its class or
    None)."""
    if entry.is_section:
        kind = entry.field.default_factory  # type: ignore[misc]  # the section's class
        return f"{kind.__name__} | None"
    annotation = entry.field.type
    if not isinstance(annotation, str):  # every module of core postpones its annotations
        raise TypeError(f"{entry.path}: its module lacks 'from __future__ import annotations'")
    # The postponed annotation is the parser's text ('a'): written as ruff formats it ("a").
    return _STRING.sub(lambda m: '"' + m.group()[1:-1] + '"', annotation)


def _sources(annotation: str, owner: type) -> dict[str, str]:
    """The module each name of ``annotation`` is imported from: where the object was
    defined when that module holds it under this name, else the section's own module
    (a type alias such as ``AmpDtype``)."""
    found: dict[str, str] = {}
    home = sys.modules[owner.__module__]
    for name in _NAME.findall(_STRING.sub("", annotation)):
        if name == "None" or hasattr(builtins, name):
            continue
        value = getattr(home, name)
        defined = getattr(value, "__module__", None)
        module = sys.modules.get(defined or "")
        found[name] = defined if module and getattr(module, name, None) is value else home.__name__
    return found


def _imports(names: dict[str, str]) -> list[str]:
    by_module: dict[str, set[str]] = {}
    for name, module in names.items():
        by_module.setdefault(module, set()).add(name)
    stdlib = sorted(m for m in by_module if not m.startswith("core"))
    ours = sorted(m for m in by_module if m.startswith("core"))
    lines = [_import_line(m, by_module[m]) for m in stdlib] + [""]
    return lines + [_import_line(m, by_module[m]) for m in ours]


def _import_line(module: str, names: set[str]) -> str:
    return f"from {module} import {', '.join(sorted(names))}"


def source() -> str:
    """The text ``flat_settings.py`` should hold for the tree as it is."""
    fields = flat_fields()
    leaves = [f for f in fields if not f.is_section]
    keys = [(f.keyword, _annotation(f), f"Sets ``{f.path}``.") for f in leaves]
    keys += [
        (alias, _annotation(f), f"Another name for ``{f.keyword}``.")
        for f in leaves
        for alias in flat_aliases(f.field)
    ]
    keys += [
        (f.keyword, _annotation(f), f"Sets the whole ``{f.path}`` section.")
        for f in fields
        if f.is_section
    ]
    names = {"TypedDict": "typing"}
    for entry in fields:
        names |= _sources(_annotation(entry), entry.owner)
    body = [
        "class FlatSettings(TypedDict, total=False):",
        '    """The factory\'s settings keywords, typed; each says what it sets."""',
        "",
    ]
    for keyword, annotation, doc in keys:
        body += [f"    {keyword}: {annotation}", f'    """{doc}"""']
    text = _HEADER.format(command=COMMAND)
    text += "\n".join(_imports(names)) + '\n\n__all__ = ("FlatSettings",)\n\n\n'
    return text + "\n".join(body) + "\n"


def difference() -> str:
    """A unified diff from the checked-in file to :func:`source` ("" when they agree)."""
    lines = difflib.unified_diff(
        FILE.read_text().splitlines(keepends=True),
        source().splitlines(keepends=True),
        "core/facades/flat_settings.py (checked in)",
        "core/facades/flat_settings.py (from the tree)",
    )
    return "".join(lines)


def main() -> None:
    FILE.write_text(source())


if __name__ == "__main__":
    main()
